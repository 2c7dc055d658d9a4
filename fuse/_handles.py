"""The FUSE handlers of open files: open, create, read, write, flush, fsync, release.

A file opened for writing is staged whole in the spool; the upload follows
its writes while they go front to back (``Stream``) and the new version is
committed when the process that opened it closes it, on fsync, or at its
last release (see ``_ops`` for the semantics, ``_openers`` for who closed
what). Reads go through ``Blocks``, fetched ahead in the background.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Awaitable, Callable
from typing import cast

import msgspec
import pyfuse3

from graben.store import AsyncClient, AsyncReadFile, Change, FileInfo

from ._base import Base, Handle, OpenFile, answers_errno, log
from ._blocks import Blocks
from ._openers import Fate, fate, opener
from ._spool import SpoolFile
from ._stream import Stream


class FileHandles(Base):
    """The handlers of open files (``Operations`` adds names and directories)."""

    @answers_errno
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        writing = flags & (os.O_WRONLY | os.O_RDWR) != 0
        await self._names_settled()
        await self._releases.settled(inode)
        path = self._path(inode)
        if writing or flags & os.O_TRUNC:
            self._writable(path)
        file = self._open.setdefault(inode, OpenFile())
        file.handles += 1
        # Two small /proc reads: cheaper here than a thread hop.
        handle = Handle(inode, file, writing=writing, opener=opener(ctx.pid) if writing else None)
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
                handle.reader = await self._reader(path)
                file.info = handle.reader.info
                self._opened(inode, file.info)
        except BaseException:
            await self._closed(inode, file)
            raise
        fh = self._new_fh()
        self._handles[fh] = handle
        return pyfuse3.FileInfo(fh=fh, keep_cache=self._keep_cache(inode, handle))

    async def _reader(self, path: str) -> AsyncReadFile:
        """The version of ``path`` committed now, read on this loop."""
        return cast(AsyncReadFile, await self.client.aio.open(path, "rb"))

    def _opened(self, inode: int, info: FileInfo) -> None:
        """Close-to-open: an open sees the version committed last, wherever it was
        written. If the kernel holds another version's attributes (a write elsewhere the
        change feed has not brought yet), it forgets them: its reads ask for the size."""
        was = self.known.get(inode)
        self.note_own_change(inode, info)
        if was is not None and (was.inode, was.ctime_ns, was.size) != (
            info.inode,
            info.ctime_ns,
            info.size,
        ):
            try:
                pyfuse3.invalidate_inode(inode, attr_only=True)
            except OSError as exc:  # the kernel forgot it meanwhile
                log.debug("could not invalidate inode %d: %s", inode, exc)

    def _keep_cache(self, inode: int, handle: Handle) -> bool:
        """Whether the kernel may keep the pages it cached for the inode at its last open.

        Not those of a version this mount wrote: tried, the kernel read such a file
        again anyway, likely as its mtime from the write differs from the store's
        (libfuse's ``auto_inval_data``, which pyfuse3 leaves on)."""
        if handle.reader is None:
            self._versions.pop(inode, None)
            return False
        version = (handle.reader.info.inode, handle.reader.info.generation)
        keep = self._versions.get(inode) == version
        self._versions[inode] = version
        return keep

    async def _spooled(self, inode: int, file: OpenFile, *, keep: bool) -> SpoolFile:
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
        path = self._child(parent_inode, name)
        self._writable(path)
        await self._names_settled()
        await self._releases.settled(self.inodes.peek(path))
        inode = self.inodes.lookup(path)
        self.whole.added(path)
        file = self._open.setdefault(inode, OpenFile())
        file.handles += 1
        file.created = file.spool is None
        file.permissions = mode & 0o7777
        file.uid, file.gid = ctx.uid, ctx.gid
        await self._spooled(inode, file, keep=False)
        self._stream(inode, file)
        fh = self._new_fh()
        self._handles[fh] = Handle(inode, file, writing=True, opener=opener(ctx.pid))
        return pyfuse3.FileInfo(fh=fh), self._attrs(inode, None, file)

    @answers_errno
    async def read(self, fh: int, off: int, size: int) -> bytes:
        handle = self._handles[fh]
        if handle.file.spool is not None:
            return handle.file.spool.read(off, size)
        if handle.reader is None:  # opened before a write elsewhere dropped its spool
            handle.reader = await self._reader(self._path(handle.inode))
        if handle.blocks is None:
            assert self.nursery is not None
            reader = handle.reader
            length, block = reader.info.size, self.client.chunk_size
            handle.blocks = Blocks(
                _positional(reader), length, block, self.nursery, self.read_ahead
            )
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
        file.mtime_ns, file.mtime_set = time.time_ns(), None
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
        if not file.created and (file.spool is None or not file.spool.dirty):
            return  # nothing to commit or drop (fsynced already): whoever closed, no matter
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
        await self._names_settled()  # what was unlinked before stays unlinked
        await self._commit(handle.inode, handle.file)

    @answers_errno
    async def release(self, fh: int) -> None:
        handle = self._handles.pop(fh)
        if handle.blocks is not None:
            handle.blocks.close()
        try:
            with self._releases.running(handle.inode):  # before any await: see ``_releases``
                await self._closed(handle.inode, handle.file)
        except (OSError, pyfuse3.FUSEError) as exc:
            # Nobody waits for a release's answer (the kernel sent it after the close
            # returned, and drops it once unmounted): the log is where this error goes.
            name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            path = self.inodes.path(handle.inode) if handle.inode in self.inodes else "?"
            log.warning("%s: not committed at its last close (%s): %s", path, name, exc)
        finally:
            if handle.reader is not None:
                await handle.reader.close()

    async def _truncate(self, inode: int, size: int, *, commit: bool) -> None:
        """Cut or extend a file; ``commit`` publishes it now (else its last close does)."""
        file = self._open.setdefault(inode, OpenFile())
        file.handles += 1
        file.abandoned = False  # changed by a live process: it is its content now
        try:
            spool = await self._spooled(inode, file, keep=size > 0)
            async with file.lock:
                await self._unstream(file)
                spool.truncate(size)
            file.mtime_ns, file.mtime_set = time.time_ns(), None
            if commit:
                await self._commit(inode, file)
        finally:
            await self._closed(inode, file)

    async def _commit(self, inode: int, file: OpenFile) -> None:
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
            change = Change(file.permissions, file.mtime_set, None, file.uid, file.gid)
            try:
                async with self.own_change():  # its row in the feed is no other client's
                    done = None if stream is None else await stream.finish(spool)
                    streamed = done is not None
                    if done is None:
                        async with spool.mapped_for_put() as view:
                            done = await self._ask(
                                lambda aio: aio.put(path, view, attributes=change)
                            )
                    made = done.ctime_ns  # when the name was made, if it was
                    if streamed and change != Change():  # a stream commits as a plain open
                        done = await self._ask(lambda aio: set_attributes(aio, path, change))
                    self.note_own_change(inode, done)
                file.permissions = file.uid = file.gid = file.mtime_set = None
            except BaseException:
                spool.dirty = True
                raise
        if file.created:
            self._entries_changed(path, made)
        file.created = False

    def _entries_changed(self, path: str, when: int) -> None:
        """A new name in a directory is in the store now, made at ``when`` (the commit's
        time, which the directory's mtime and ctime took): the kernel's copy of the
        directory's attributes is out of date; the daemon's is brought up to date."""
        self.listings.touch(path)
        parent = self.inodes.peek(path.rpartition("/")[0] or "/")
        was = self.known.get(parent) if parent is not None else None
        if parent in self.exact and was is not None:
            when = max(when, was.mtime_ns)
            self.known[parent] = msgspec.structs.replace(was, mtime_ns=when, ctime_ns=when)
        if parent is not None:
            try:
                pyfuse3.invalidate_inode(parent, attr_only=True)
            except OSError as exc:  # the kernel forgot it meanwhile
                log.debug("could not invalidate the directory of %s: %s", path, exc)

    def _stream(self, inode: int, file: OpenFile) -> None:
        """Upload a new or truncated file while it is written."""
        if file.spool is not None and file.spool.size == 0:
            file.stream = Stream(self.client, self._path(inode), self.client.chunk_size)

    @staticmethod
    async def _unstream(file: OpenFile) -> None:
        """Drop the file's stream (its content will be committed from the spool)."""
        stream, file.stream = file.stream, None
        if stream is not None:
            await stream.abandon()

    async def _closed(self, inode: int, file: OpenFile) -> None:
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


async def set_attributes(client: AsyncClient, path: str, change: Change) -> FileInfo:
    """Apply ``change`` to the file at ``path``."""
    c = change
    return await client.set_attributes(
        path, mode=c.mode, mtime_ns=c.mtime_ns, atime_ns=c.atime_ns, uid=c.uid, gid=c.gid
    )


def _positional(reader: AsyncReadFile) -> Callable[[int, memoryview], Awaitable[int]]:
    async def fetch(offset: int, into: memoryview) -> int:
        reader.seek(offset)
        return await reader.readinto(into)

    return fetch
