"""The FUSE operations: the kernel's requests answered from the store.

Every handler runs on pyfuse3's trio loop. Store calls block, so they run in
worker threads (``trio.to_thread``): one slow read does not stall the others.
Every error becomes a ``FUSEError`` with the errno it means (graben's errors
carry theirs); anything unexpected is logged and answered with ``EIO``, so no
exception reaches the loop.

Semantics: close-to-open, as NFS and JuiceFS give. A file opened for writing
is staged whole in the spool and committed, as one new version, when the
process that opened it closes it (or exits), on fsync, or when its last
descriptor goes; other clients see the new version from their next open.
Another process closing its copy of the descriptor (a subprocess at exec, a
forked child) commits nothing, and a writer that dies of a signal leaves the
version it last committed (see ``_openers``). Renames, mkdir, rmdir and
unlink go straight to the store (one transaction each). An unlinked file
stays readable through the handles open on it.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import stat
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar, cast

import pyfuse3
import trio

from graben.store import Client, FileInfo, ReadFile

from ._blocks import Blocks
from ._inodes import ROOT, InodeTable, is_unlinked
from ._openers import Fate, Opener, fate, opener
from ._releases import Releases
from ._spool import Spool, SpoolFile
from ._stream import Stream

log = logging.getLogger("graben.fuse")
P = ParamSpec("P")
R = TypeVar("R")
SYMLINK = stat.S_IFLNK | 0o777
"""The mode a symbolic link is stored with (its content is the target)."""
FILE_MODE = 0o644
"""What a new file gets unless told otherwise (the store's default too)."""
NAME_MAX = 255
"""Longest name, in bytes, as on every Linux filesystem."""
BLKSIZE = 1 << 20
"""``st_blksize``: what ``cp`` and friends take as the I/O size to use."""


def answers_errno(
    handler: Callable[P, Coroutine[Any, Any, R]],
) -> Callable[P, Coroutine[Any, Any, R]]:
    """Turn every error a handler raises into a ``FUSEError`` the kernel understands."""

    @functools.wraps(handler)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await handler(*args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except Exception as exc:
            code = getattr(exc, "errno", None)
            if not isinstance(code, int) or code <= 0:
                log.exception("%s failed", handler.__name__)
                code = errno.EIO
            raise pyfuse3.FUSEError(code) from exc

    return wrapper


@dataclass(eq=False)
class _Open:
    """A file with open handles."""

    handles: int = 0
    spool: SpoolFile | None = None
    """Its content while it is open for writing."""
    created: bool = False
    """Created here and not committed yet."""
    unlinked: bool = False
    info: FileInfo | None = None
    """The committed version its read handles opened (what an unlinked file still is)."""
    permissions: int = 0
    """Mode bits for its next commit (0: keep the committed version's)."""
    failed: int = 0
    """The errno of a write that failed: the content is torn, and is never committed."""
    abandoned: bool = False
    """A writer died of a signal since the last commit, and nothing was written after it:
    the content is torn, and is dropped at the last close."""
    stream: Stream | None = None
    """The upload following its writes while they go front to back."""
    mtime_ns: int = field(default_factory=time.time_ns)
    lock: trio.Lock = field(default_factory=trio.Lock)
    """Held while the spool is committed: its mapping must not change meanwhile."""


@dataclass(eq=False)
class _Handle:
    inode: int
    file: _Open
    reader: ReadFile | None = None
    blocks: Blocks | None = None
    writing: bool = False
    opener: Opener | None = None
    """The process that opened it for writing, until its close (or death) was seen."""


class Operations(pyfuse3.Operations):
    """A mounted store."""

    supports_dot_lookup = False
    enable_writeback_cache = False

    def __init__(
        self, client: Client, spool: Spool, *, read_only: bool = False, timeout: float = 1.0
    ) -> None:
        super().__init__()
        self.client, self.spool = client, spool
        self.read_only, self.timeout = read_only, timeout
        self.inodes = InodeTable()
        self._open: dict[int, _Open] = {}
        self._handles: dict[int, _Handle] = {}
        self._listings: dict[int, list[tuple[str, str, FileInfo | None]]] = {}
        self._next_fh = 1
        self._versions: dict[int, tuple[int, int]] = {}
        self._uid, self._gid = os.getuid(), os.getgid()
        self._releases = Releases()
        self.nursery: trio.Nursery | None = None
        """Where background reads run; set by the mount before serving."""
        self.device: str | None = None
        """The mount's ``major:minor`` (tells its files from others' in ``/proc``)."""

    # -- helpers ---------------------------------------------------------------

    async def _call(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        """``fn(*args, **kwargs)`` in a worker thread: store calls block."""
        return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))

    def _path(self, inode: int) -> str:
        try:
            path = self.inodes.path(inode)
        except KeyError:
            raise pyfuse3.FUSEError(errno.ESTALE) from None
        if is_unlinked(path):
            raise pyfuse3.FUSEError(errno.ENOENT)
        return path

    def _child(self, parent: int, name: bytes) -> str:
        if len(name) > NAME_MAX:
            raise pyfuse3.FUSEError(errno.ENAMETOOLONG)
        return self.inodes.child(self._path(parent), os.fsdecode(name))

    def _writable(self) -> None:
        if self.read_only:
            raise pyfuse3.FUSEError(errno.EROFS)

    def _attrs(
        self, inode: int, info: FileInfo | None, file: _Open | None
    ) -> pyfuse3.EntryAttributes:
        attrs = pyfuse3.EntryAttributes()
        attrs.st_ino = inode
        attrs.entry_timeout = attrs.attr_timeout = self.timeout
        attrs.st_mode, attrs.st_nlink = _mode(info, file), 1
        if stat.S_ISDIR(attrs.st_mode):
            attrs.st_nlink = 2
        size = info.size if info is not None else 0
        mtime = info.mtime_ns if info is not None else time.time_ns()
        if file is not None and file.spool is not None:
            size, mtime = file.spool.size, file.mtime_ns
        attrs.st_size = size
        attrs.st_blocks = (size + 511) // 512
        attrs.st_blksize = BLKSIZE
        attrs.st_atime_ns = attrs.st_ctime_ns = attrs.st_mtime_ns = mtime
        attrs.st_uid, attrs.st_gid = self._uid, self._gid
        return attrs

    async def _stat(self, inode: int, path: str) -> pyfuse3.EntryAttributes:
        file = self._open.get(inode)
        if file is not None and (file.created or file.unlinked):
            return self._attrs(inode, file.info, file)
        return self._attrs(inode, await self._call(self.client.stat, path), file)

    # -- names -------------------------------------------------------------------

    @answers_errno
    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        path = self._child(parent_inode, name)
        await self._releases.settled(self.inodes.peek(path))
        inode = self.inodes.peek(path)
        attrs = await self._stat(inode, path) if inode is not None else None
        if attrs is None:
            info = await self._call(self.client.stat, path)
            attrs = self._attrs(self.inodes.number(path), info, None)
        self.inodes.lookup(path)
        return attrs

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for inode, count in inode_list:
            self.inodes.forget(inode, count)

    @answers_errno
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        await self._releases.settled(inode)
        file = self._open.get(inode)
        if file is not None and file.unlinked:
            return self._attrs(inode, file.info, file)
        return await self._stat(inode, self._path(inode))

    @answers_errno
    async def setattr(
        self,
        inode: int,
        attr: pyfuse3.EntryAttributes,
        fields: pyfuse3.SetattrFields,
        fh: int | None,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        await self._releases.settled(inode)
        if fields.update_uid and attr.st_uid != self._uid:
            raise pyfuse3.FUSEError(errno.EPERM)  # every file is the mounting user's
        if fields.update_gid and attr.st_gid != self._gid:
            raise pyfuse3.FUSEError(errno.EPERM)
        if fields.update_size:
            self._writable()
            await self._truncate(inode, attr.st_size, commit=fh is None)
        mode = attr.st_mode & 0o7777 if fields.update_mode else None
        mtime = attr.st_mtime_ns if fields.update_mtime else None
        if mode is not None or mtime is not None:
            self._writable()
            await self._set_attributes(inode, mode, mtime)
        return await self.getattr(inode, ctx)

    async def _set_attributes(self, inode: int, mode: int | None, mtime: int | None) -> None:
        """chmod and utimens (no atime is kept: reads never write)."""
        file = self._open.get(inode)
        if file is not None and mode is not None:
            file.permissions = mode  # for a commit still to come
        if file is not None and file.created:
            return
        path = self._path(inode)
        await self._call(self.client.set_attributes, path, mode=mode, mtime_ns=mtime)

    async def _truncate(self, inode: int, size: int, *, commit: bool) -> None:
        """Cut or extend a file; ``commit`` publishes it now (else its last close does)."""
        file = self._open.setdefault(inode, _Open())
        file.handles += 1
        file.abandoned = False  # changed by a live process: it is its content now
        try:
            spool = await self._spooled(inode, file, keep=size > 0)
            async with file.lock:
                await self._unstream(file)
                spool.truncate(size)
            file.mtime_ns = time.time_ns()
            if commit:
                await self._commit(inode, file)
        finally:
            await self._closed(inode, file)

    @answers_errno
    async def mkdir(
        self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        self._writable()
        path = self._child(parent_inode, name)
        info = await self._call(self.client.mkdir, path)
        if mode & 0o7777 != info.mode:
            info = await self._call(self.client.set_attributes, path, mode=mode & 0o7777)
        return self._attrs(self.inodes.lookup(path), info, None)

    @answers_errno
    async def symlink(
        self, parent_inode: int, name: bytes, target: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        self._writable()
        path = self._child(parent_inode, name)
        info = await self._call(self.client.put, path, target, exclusive=True, permissions=SYMLINK)
        return self._attrs(self.inodes.lookup(path), info, None)

    @answers_errno
    async def readlink(self, inode: int, ctx: pyfuse3.RequestContext) -> bytes:
        path = self._path(inode)
        if not stat.S_ISLNK((await self._call(self.client.stat, path)).mode):
            raise pyfuse3.FUSEError(errno.EINVAL)
        return await self._call(self.client.get, path)

    @answers_errno
    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        self._writable()
        path = self._child(parent_inode, name)
        await self._releases.all_settled()
        if not (await self._call(self.client.stat, path)).is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        await self._call(self.client.rm, path)
        self.inodes.removed(path)

    @answers_errno
    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        self._writable()
        path = self._child(parent_inode, name)
        await self._releases.settled(self.inodes.peek(path))
        inode = self.inodes.peek(path)
        file = self._open.get(inode) if inode is not None else None
        if file is not None and file.created:
            file.unlinked = True
        else:
            if (await self._call(self.client.stat, path)).is_dir:
                raise pyfuse3.FUSEError(errno.EISDIR)
            await self._call(self.client.rm, path)
            if file is not None:
                file.unlinked = True  # its handles read the version they opened
        self.inodes.removed(path)

    @answers_errno
    async def rename(
        self,
        parent_inode_old: int,
        name_old: bytes,
        parent_inode_new: int,
        name_new: bytes,
        flags: int,
        ctx: pyfuse3.RequestContext,
    ) -> None:
        self._writable()
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise pyfuse3.FUSEError(errno.EINVAL)
        old = self._child(parent_inode_old, name_old)
        new = self._child(parent_inode_new, name_new)
        await self._releases.all_settled()
        await self._commit_below(old)
        replace = not flags & pyfuse3.RENAME_NOREPLACE
        await self._call(self.client.rename, old, new, replace=replace)
        replaced = self.inodes.peek(new)
        if replaced is not None and replaced != self.inodes.peek(old) and replaced in self._open:
            self._open[replaced].unlinked = True  # its handles keep what they had
        self.inodes.moved(old, new)

    async def _commit_below(self, top: str) -> None:
        """Commit files created or written at or below ``top``, so a rename moves them."""
        prefix = top.rstrip("/") + "/"
        for inode, file in list(self._open.items()):
            path = self.inodes.path(inode)
            if (path == top or path.startswith(prefix)) and (
                file.created or (file.spool is not None and file.spool.dirty)
            ):
                await self._commit(inode, file)

    # -- directories -------------------------------------------------------------

    @answers_errno
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        await self._releases.all_settled()
        path = self._path(inode)
        entries: list[tuple[str, str, FileInfo | None]] = [
            (info.name, info.path, info) for info in await self._call(self.client.ls, path)
        ]
        listed = {name for name, _, _ in entries}
        for other, file in self._open.items():
            pending = self.inodes.path(other)
            directory, _, name = pending.rpartition("/")
            here = (directory or "/") == path
            if file.created and not file.unlinked and here and name not in listed:
                entries.append((name, pending, None))
        fh = self._new_fh()
        self._listings[fh] = entries
        return fh

    @answers_errno
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        entries = self._listings[fh]
        for index in range(start_id, len(entries)):
            name, path, info = entries[index]
            inode = self.inodes.number(path)
            attrs = self._attrs(inode, info, self._open.get(inode))
            if not pyfuse3.readdir_reply(token, os.fsencode(name), attrs, index + 1):
                return
            self.inodes.lookup(path)

    async def releasedir(self, fh: int) -> None:
        self._listings.pop(fh, None)

    # -- files -------------------------------------------------------------------

    def _new_fh(self) -> int:
        fh, self._next_fh = self._next_fh, self._next_fh + 1
        return fh

    @answers_errno
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        writing = flags & (os.O_WRONLY | os.O_RDWR) != 0
        if writing or flags & os.O_TRUNC:
            self._writable()
        await self._releases.settled(inode)
        path = self._path(inode)
        file = self._open.setdefault(inode, _Open())
        file.handles += 1
        # Two small /proc reads: cheaper here than a thread hop.
        handle = _Handle(inode, file, writing=writing, opener=opener(ctx.pid) if writing else None)
        try:
            if writing:
                spool = await self._spooled(inode, file, keep=not flags & os.O_TRUNC)
                if flags & os.O_TRUNC:
                    if spool.size:  # another handle had it spooled
                        async with file.lock:
                            await self._unstream(file)
                            spool.truncate(0)
                    self._stream(inode, file)
            elif flags & os.O_TRUNC:
                await self._truncate(inode, 0, commit=True)
            if file.spool is None and not file.created:
                # Opened now, so the handle reads this version even if the path
                # is overwritten or unlinked before it reads.
                handle.reader = await self._call(self.client.open, path, "rb")
                file.info = handle.reader.info
        except BaseException:
            await self._closed(inode, file)
            raise
        fh = self._new_fh()
        self._handles[fh] = handle
        return pyfuse3.FileInfo(fh=fh, keep_cache=self._keep_cache(inode, handle))

    def _keep_cache(self, inode: int, handle: _Handle) -> bool:
        """Whether the kernel may keep the pages it cached for the inode at its last open."""
        if handle.reader is None:
            self._versions.pop(inode, None)
            return False
        version = (handle.reader.info.inode, handle.reader.info.generation)
        keep = self._versions.get(inode) == version
        self._versions[inode] = version
        return keep

    async def _spooled(self, inode: int, file: _Open, *, keep: bool) -> SpoolFile:
        """The file's spool, filled with its committed content if ``keep``."""
        if file.spool is not None:
            return file.spool
        spool = self.spool.new()
        try:
            if keep and not file.created:
                path = self._path(inode)
                reader = await self._call(self.client.open, path, "rb")
                try:
                    await self._call(spool.fill, reader, reader.info.size)
                finally:
                    await self._call(reader.close)
            else:
                spool.dirty = True  # truncated: the empty file is a change
        except BaseException:
            spool.close()
            raise
        file.spool = spool
        return spool

    @answers_errno
    async def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: pyfuse3.RequestContext
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        self._writable()
        path = self._child(parent_inode, name)
        await self._releases.settled(self.inodes.peek(path))
        inode = self.inodes.lookup(path)
        file = self._open.setdefault(inode, _Open())
        file.handles += 1
        file.created = file.spool is None
        file.permissions = mode & 0o7777
        await self._spooled(inode, file, keep=False)
        self._stream(inode, file)
        fh = self._new_fh()
        self._handles[fh] = _Handle(inode, file, writing=True, opener=opener(ctx.pid))
        return pyfuse3.FileInfo(fh=fh), self._attrs(inode, None, file)

    @answers_errno
    async def read(self, fh: int, off: int, size: int) -> bytes:
        handle = self._handles[fh]
        if handle.file.spool is not None:
            return handle.file.spool.read(off, size)
        if handle.reader is None:  # opened before a write elsewhere dropped its spool
            handle.reader = await self._call(self.client.open, self._path(handle.inode), "rb")
        if handle.blocks is None:
            assert self.nursery is not None
            reader = handle.reader
            length, block = reader.info.size, self.client.chunk_size
            handle.blocks = Blocks(_positional(reader), length, block, self.nursery)
        # pyfuse3 replies from any buffer; the stub says bytes.
        return cast(bytes, await handle.blocks.read(off, size))

    @answers_errno
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        handle = self._handles[fh]
        spool = handle.file.spool
        if spool is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        file = handle.file
        async with file.lock:
            if file.stream is not None and not file.stream.follows(off, spool):
                await self._unstream(file)
            # A page-cache write of at most 1 MiB: cheaper here than a thread hop.
            try:
                written = spool.write(off, buf)
            except OSError as exc:
                file.failed = exc.errno or errno.EIO
                raise
            if file.stream is not None:
                assert self.nursery is not None
                file.stream.advance(spool, self.nursery)
        file.mtime_ns = time.time_ns()
        file.abandoned = False  # written by a live process: it is its content now
        return written

    @answers_errno
    async def flush(self, fh: int) -> None:
        """A descriptor was closed, by the opener or by any process holding a copy.

        Commit only if the process that opened the handle let it go: a copy
        closed elsewhere (a subprocess at exec, a forked child) must not
        publish a file its writer is still writing. A writer dying of a
        signal leaves its torn content to be dropped.
        """
        handle = self._handles[fh]
        file = handle.file
        if not handle.writing:
            return
        if file.failed:  # tell the writer's close (the content will not be committed)
            raise pyfuse3.FUSEError(file.failed)
        if handle.opener is None:  # let go already, or unknown: the last release commits
            return
        seen = await self._call(fate, handle.opener, handle.inode, self.device)
        if seen is Fate.KILLED:
            path = self.inodes.path(handle.inode)
            log.warning("%s: its writer died of a signal; its changes are dropped", path)
            handle.opener, file.abandoned = None, True
        elif seen is Fate.CLOSED:
            handle.opener = None
            await self._commit(handle.inode, file)

    @answers_errno
    async def fsync(self, fh: int, datasync: bool) -> None:
        handle = self._handles[fh]
        handle.file.abandoned = False  # asked for by a live process
        await self._commit(handle.inode, handle.file)

    @answers_errno
    async def release(self, fh: int) -> None:
        handle = self._handles.pop(fh)
        if handle.blocks is not None:
            handle.blocks.close()
        try:
            with self._releases.running(handle.inode):  # before any await: see ``_releases``
                await self._closed(handle.inode, handle.file)
        finally:
            if handle.reader is not None:
                await self._call(handle.reader.close)

    async def _commit(self, inode: int, file: _Open) -> None:
        """Publish the spooled content as the file's new version, if it changed."""
        spool = file.spool
        if spool is None or file.unlinked or file.abandoned or not (spool.dirty or file.created):
            return
        if file.failed:  # the committed version stays what it was
            raise pyfuse3.FUSEError(file.failed)
        path = self._path(inode)
        async with file.lock:
            spool.dirty = False
            stream, file.stream = file.stream, None
            try:
                if stream is None or not await stream.finish(spool):
                    await self._call(_put_spooled, self.client, path, spool, file.permissions)
                elif file.permissions not in (0, FILE_MODE):  # a stream commits 0o644
                    await self._call(self.client.set_attributes, path, mode=file.permissions)
                file.permissions = 0
            except BaseException:
                spool.dirty = True
                raise
        file.created = False

    def _stream(self, inode: int, file: _Open) -> None:
        """Upload a new or truncated file while it is written."""
        if file.spool is not None and file.spool.size == 0:
            file.stream = Stream(self.client, self._path(inode), self.client.chunk_size)

    @staticmethod
    async def _unstream(file: _Open) -> None:
        """Drop the file's stream (its content will be committed from the spool)."""
        stream, file.stream = file.stream, None
        if stream is not None:
            await stream.abandon()

    async def _closed(self, inode: int, file: _Open) -> None:
        """One handle fewer; the last one commits what is left and drops the spool."""
        file.handles -= 1
        try:
            # A truncate by path may change the spool while we commit: go again.
            while (
                file.handles == 0
                and not (file.failed or file.unlinked or file.abandoned)
                and file.spool
                and file.spool.dirty
            ):
                await self._commit(inode, file)
        finally:
            if file.handles == 0:  # nobody opened the file meanwhile
                await self._unstream(file)
                if self._open.get(inode) is file:
                    del self._open[inode]
                if file.spool is not None:
                    file.spool.close()
                    file.spool = None

    @answers_errno
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        health = await self._call(self.client.health)
        live = [n for n in health.nodes if n.alive]
        copies = max(1, min(health.replication, len(live) or 1))
        data = pyfuse3.StatvfsData()
        data.f_bsize = BLKSIZE
        data.f_frsize = 4096
        data.f_blocks = sum(n.total for n in live) // copies // data.f_frsize
        data.f_bfree = data.f_bavail = sum(n.free for n in live) // copies // data.f_frsize
        data.f_files = data.f_ffree = data.f_favail = 1 << 32  # no inode table to run out of
        data.f_namemax = NAME_MAX
        return data


def _mode(info: FileInfo | None, file: _Open | None) -> int:
    """``st_mode``: type and permission bits."""
    if info is not None and info.is_dir:
        return stat.S_IFDIR | info.mode
    if file is not None and file.permissions:
        return stat.S_IFREG | file.permissions
    if info is None:
        return stat.S_IFREG | 0o644
    return info.mode if stat.S_ISLNK(info.mode) else stat.S_IFREG | info.mode


def _put_spooled(client: Client, path: str, spool: SpoolFile, permissions: int) -> None:
    with spool.mapped() as view:
        client.put(path, view, permissions=permissions)


def _positional(reader: ReadFile) -> Callable[[int, memoryview], int]:
    def fetch(offset: int, into: memoryview) -> int:
        reader.seek(offset)
        return reader.readinto(into)

    return fetch


__all__ = ["ROOT", "Operations"]
