"""The FUSE operations: the kernel's requests answered from the store.

Every handler runs on the daemon's asyncio loop (``_aio``). Store calls that block
run in worker threads (``in_thread``): one slow read does not stall the others.
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
import os
import posixpath
import stat
import time
from collections.abc import Sequence

import pyfuse3

from graben.store import Change, FileInfo, NotFound

from ._base import (
    BLKSIZE,
    MAX_FILE_SIZE,
    NAME_MAX,
    SYMLINK,
    Entry,
    Listing,
    answers_errno,
    within,
)
from ._handles import FileHandles, set_attributes
from ._inodes import ROOT, is_unlinked
from ._queue import changed

UNBOUNDED = 1 << 50
"""What ``df`` shows a tenant's mount with no byte quota: 1 PiB."""


class Operations(FileHandles):
    """A mounted store."""

    supports_dot_lookup = False
    enable_writeback_cache = False

    # -- names -------------------------------------------------------------------

    @answers_errno
    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        path = self._child(parent_inode, name)
        if path in self.queue:
            return self._absent()  # unlinked here, on its way out of the store
        if self.queue.changing(path):
            await self._names_settled()  # its attributes as the store has them
        await self._releases.settled(self.inodes.peek(path))
        inode = self.inodes.peek(path)
        if inode is None and self.whole.lacks(path):
            return self._absent()  # its directory is held whole, without it
        attrs = await self._stat(inode, path) if inode is not None else None
        if attrs is None:
            since = self.changes_made
            try:
                info = await self._stat_path(path)
            except NotFound:
                return self._absent()
            number = self.inodes.number(path, linked(info))
            attrs = self._attrs(number, info, self._open.get(number), since=since)
        self.inodes.lookup(path)
        return attrs

    def _absent(self) -> pyfuse3.EntryAttributes:
        """A name that is not there, which the kernel may remember for the entry timeout
        (a negative entry: ``git status``, ``import`` probe the same missing names again
        and again); another client's creating it drops it sooner (``_follow``)."""
        attrs = pyfuse3.EntryAttributes()
        attrs.st_ino = 0
        attrs.entry_timeout = self.timeout
        return attrs

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for inode, count in inode_list:
            self.inodes.forget(inode, count)
            if inode not in self.inodes:
                self.known.pop(inode, None)

    @answers_errno
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        known = self.known.get(inode)
        if known is not None and known.is_dir:
            path = self._path(inode)
            now = self.queue.seen_in(path)  # names in it unlinked, going
            before = self.queue.removing_in(path) if now is None else None
            if before is not None and not before[1]:
                now = self.queue.based(path, await self._stat_path(path), before)
            if now is not None:  # the store's, and the effect of what is queued
                attrs = self._attrs(inode, now, None)
                self.exact.discard(inode)
                return attrs
        await self._names_settled()  # a link's count changes with its other names
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
        change = Change(
            mode=attr.st_mode & 0o7777 if fields.update_mode else None,
            mtime_ns=_time(attr.st_mtime_ns) if fields.update_mtime else None,
            atime_ns=_time(attr.st_atime_ns) if fields.update_atime else None,
            uid=attr.st_uid if fields.update_uid else None,
            gid=attr.st_gid if fields.update_gid else None,
        )
        await self._releases.settled(inode)  # a close's commit first, then the change
        if not fields.update_size and change != Change():
            queued = self._queue_attributes(inode, change)
            if queued is not None:
                return queued
        await self._names_settled()
        if fields.update_size:
            self._writable_inode(inode)
            if attr.st_size > MAX_FILE_SIZE:
                raise pyfuse3.FUSEError(errno.EFBIG)
            await self._truncate(inode, attr.st_size, commit=fh is None)
        if change != Change():
            self._writable_inode(inode)
            await self._set_attributes(inode, change)
        return await self.getattr(inode, ctx)

    def _queue_attributes(self, inode: int, change: Change) -> pyfuse3.EntryAttributes | None:
        """chmod adding bits or touch of a path with no open file, whose attributes the
        daemon knows: answered now with what the store will make of them, sent in a group
        (``_queue``); ``None`` where it must go to the store first. A change that takes
        a right away (a bit cleared, an owner changed) is in the store before it is
        answered, for every client: a crash cannot leave it undone."""
        known = self.known.get(inode)
        if known is None or inode in self._open or inode not in self.inodes:
            return None
        if change.uid is not None or change.gid is not None:
            return None
        if change.mode is not None and known.mode & 0o7777 & ~change.mode:
            return None
        path = self.inodes.path(inode)
        if is_unlinked(path) or path in self.queue:
            return None
        self._writable(path)
        assert self.nursery is not None
        self.queue.set_attributes(path, change, self.nursery)
        info = changed(known, change, time.time_ns())
        self.note_own_change(inode, info)
        attrs = self._attrs(inode, info, None)
        self.exact.discard(inode)  # the store's ctime will be its own
        return attrs

    async def _set_attributes(self, inode: int, change: Change) -> None:
        """chmod, chown and utimens (the kernel checked who may: ``default_permissions``)."""
        file = self._open.get(inode)
        if file is not None:  # for a commit still to come
            file.permissions = file.permissions if change.mode is None else change.mode
            file.uid = file.uid if change.uid is None else change.uid
            file.gid = file.gid if change.gid is None else change.gid
        if file is not None and file.spool is not None and change.mtime_ns is not None:
            file.mtime_ns = file.mtime_set = change.mtime_ns  # else its commit stamps "now"
        if file is not None and file.created:
            return
        path = self._path(inode)
        async with self.own_change():
            self.note_own_change(
                inode, await self._ask(lambda aio: set_attributes(aio, path, change))
            )

    @answers_errno
    async def mkdir(
        self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        path = self._child(parent_inode, name)
        self._writable(path)
        await self._names_settled()
        bits, uid, gid = mode & 0o7777, ctx.uid, ctx.gid
        since = self.whole.mark()
        info = await self._ask(lambda aio: aio.mkdir(path, mode=bits, uid=uid, gid=gid))
        self.names_changed_in(path)
        self.whole.added(path)
        self.whole.hold(path, (), since)  # new: empty
        return self._attrs(self.inodes.lookup(path), info, None)

    @answers_errno
    async def symlink(
        self, parent_inode: int, name: bytes, target: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        path = self._child(parent_inode, name)
        self._writable(path)
        await self._names_settled()
        owner = Change(uid=ctx.uid, gid=ctx.gid)
        info = await self._ask(
            lambda aio: aio.put(path, target, exclusive=True, permissions=SYMLINK, attributes=owner)
        )
        self.names_changed_in(path)
        self.whole.added(path)
        return self._attrs(self.inodes.lookup(path), info, None)

    @answers_errno
    async def mknod(
        self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        """A fifo, socket or device node: a name with attributes (the kernel does their
        I/O); a regular file from mknod is an empty file."""
        path = self._child(parent_inode, name)
        self._writable(path)
        await self._names_settled()
        await self._releases.settled(self.inodes.peek(path))
        if stat.S_ISREG(mode) or not stat.S_IFMT(mode):
            owner, bits = Change(uid=ctx.uid, gid=ctx.gid), mode & 0o7777
            info = await self._ask(
                lambda aio: aio.put(path, b"", exclusive=True, permissions=bits, attributes=owner)
            )
        else:
            uid, gid = ctx.uid, ctx.gid
            info = await self._ask(lambda aio: aio.mknod(path, mode, rdev=rdev, uid=uid, gid=gid))
        self.names_changed_in(path)
        self.whole.added(path)
        return self._attrs(self.inodes.lookup(path), info, None)

    @answers_errno
    async def link(
        self, inode: int, new_parent_inode: int, new_name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        """Another name for a file: one inode, with its link count."""
        new = self._child(new_parent_inode, new_name)
        self._writable(new)
        await self._names_settled()
        await self._releases.settled(inode)
        file = self._open.get(inode)
        if file is not None and (file.created or (file.spool is not None and file.spool.dirty)):
            await self._commit(inode, file)  # the store links what it holds
        old = self._path(inode)
        async with self.own_change():
            info = await self._ask(lambda aio: aio.link(old, new))
            self.names_changed_in(new)
            self.whole.added(new)
            self.inodes.alias(new, inode)
            self.inodes.lookup(new, info.inode)
            self.note_own_change(inode, info)  # one more link, a new ctime
        return self._attrs(inode, info, file)

    @answers_errno
    async def readlink(self, inode: int, ctx: pyfuse3.RequestContext) -> bytes:
        path = self._path(inode)
        await self._names_settled()
        if not stat.S_ISLNK((await self._stat_path(path)).mode):
            raise pyfuse3.FUSEError(errno.EINVAL)
        return await self._ask(lambda aio: aio.get(path))

    @answers_errno
    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        path = self._child(parent_inode, name)
        self._writable(path)
        if self.whole.empty(path) and not self._opened_below(path):
            # rm -rf listed it and unlinked every name: the kernel knows it is a
            # directory, the daemon that it is empty. Removed after its names.
            assert self.nursery is not None
            self.queue.remove(path, self.nursery, directory=True)
            self.names_changed_in(path)
            self.whole.removed(path)
            self.inodes.removed(path)
            return
        await self._names_settled()
        await self._releases.all_settled()
        if not (await self._stat_path(path)).is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        async with self.own_change():
            await self._ask(lambda aio: aio.rm(path))
            self.names_changed_in(path)
            self.whole.removed(path)
            self.inodes.removed(path)

    def _opened_below(self, top: str) -> bool:
        """Whether a file at or below ``top`` is open (created there, maybe)."""
        prefix = top.rstrip("/") + "/"
        return any(
            self.inodes.path(inode).startswith(prefix)
            for inode in self._open
            if inode in self.inodes
        )

    @answers_errno
    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        path = self._child(parent_inode, name)
        self._writable(path)
        await self._releases.settled(self.inodes.peek(path))
        inode = self.inodes.peek(path)
        if self.known.pop(inode or 0, None) is not None:  # one name fewer
            self.changes_made += 1
        file = self._open.get(inode) if inode is not None else None
        if file is not None and file.created:
            file.unlinked = True  # never in the store
        else:  # the kernel knows it is no directory (EISDIR is its answer)
            assert self.nursery is not None
            self.queue.remove(path, self.nursery)
        self.names_changed_in(path)
        self.whole.removed(path)
        self.inodes.removed(path)
        if file is not None and inode is not None and not self.inodes.names(inode):
            file.unlinked = True  # its handles read the version they opened

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
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise pyfuse3.FUSEError(errno.EINVAL)
        old = self._child(parent_inode_old, name_old)
        new = self._child(parent_inode_new, name_new)
        self._writable(old, new)
        await self._names_settled()
        await self._releases.all_settled()
        await self._commit_below(old)
        replace = not flags & pyfuse3.RENAME_NOREPLACE
        async with self.own_change():
            info = await self._ask(lambda aio: aio.rename(old, new, replace=replace))
            self.names_changed_in(old)
            self.names_changed_in(new)
            self.whole.moved(old, new)
            moved, replaced = self.inodes.peek(old), self.inodes.peek(new)
            if replaced is not None and replaced != moved:  # one name fewer
                self.known.pop(replaced, None)
            self.inodes.moved(old, new)
            if moved is not None:  # its new ctime, here: the change feed's row is no news
                self.note_own_change(moved, info)
        if replaced is not None and replaced in self._open and not self.inodes.names(replaced):
            self._open[replaced].unlinked = True  # its handles keep what they had

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
        await self._names_settled()
        await self._releases.all_settled()
        path = self._path(inode)
        since, made = self.whole.mark(), self.changes_made
        entries = list(await self._listed(path))
        listed = {name for name, _, _ in entries}
        for other, file in self._open.items():
            pending = self.inodes.path(other)
            directory, _, name = pending.rpartition("/")
            here = (directory or "/") == path
            if file.created and not file.unlinked and here and name not in listed:
                entries.append((name, pending, None))
        self.whole.hold(path, (name for name, _, _ in entries), since)
        parent = posixpath.dirname(path)  # the root's parent is the root
        dots: list[Entry] = [(".", path, None), ("..", parent, None)]
        fh = self._new_fh()
        self._listings[fh] = Listing(dots + entries, made)
        return fh

    async def _listed(self, path: str) -> list[Entry]:
        """The directory's entries as the store has them: kept from its last listing if
        nothing changed it since (``Listings``), else read. A listing with a file of
        several names is not kept: a link made or removed in another directory changes
        that file's link count."""
        kept = self.listings.get(path)
        if kept is not None:
            return kept
        since = self.listings.mark()
        infos = await self._ask(lambda aio: aio.ls(path))
        entries: list[Entry] = [(info.name, info.path, info) for info in infos]
        if not any(info.nlink > 1 and not info.is_dir for info in infos):
            self.listings.keep(path, entries, since)
        return entries

    @answers_errno
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        listing = self._listings[fh]
        entries = listing.entries
        for index in range(start_id, len(entries)):
            name, path, info = entries[index]
            dot = name in (".", "..")
            inode = self.inodes.number(path, linked(info))
            if dot:  # the kernel takes only their inode and type, and counts no lookup
                attrs = pyfuse3.EntryAttributes()
                attrs.st_ino, attrs.st_mode = inode, stat.S_IFDIR
            else:
                file = self._open.get(inode)
                attrs = self._attrs(inode, info, file, since=listing.changes_made)
            if not pyfuse3.readdir_reply(token, os.fsencode(name), attrs, index + 1):
                return
            if not dot:
                self.inodes.lookup(path)

    async def releasedir(self, fh: int) -> None:
        self._listings.pop(fh, None)

    @answers_errno
    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        """The directory's changes are in the store (every other one was on its answer;
        an unlink answered at once is now too)."""
        await self._names_settled()

    @answers_errno
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        await self._names_settled()  # df after rm: what the removals freed
        if self.reach != "/":  # a tenant's token: its quota is its disk
            total, free = await self._quota_space()
        else:
            health = await self._ask(lambda aio: aio.health())
            live = [n for n in health.nodes if n.alive]
            copies = max(1, min(health.replication, len(live) or 1))
            total = sum(n.total for n in live) // copies
            free = sum(n.free for n in live) // copies
        data = pyfuse3.StatvfsData()
        data.f_bsize = BLKSIZE
        data.f_frsize = 4096
        data.f_blocks = total // data.f_frsize
        data.f_bfree = data.f_bavail = free // data.f_frsize
        data.f_files = data.f_ffree = data.f_favail = 1 << 32  # no inode table to run out of
        data.f_namemax = NAME_MAX
        return data

    async def _quota_space(self) -> tuple[int, int]:
        """(total, free) bytes for a tenant's mount, which may not see the nodes' disks:
        the tightest byte quota at or above its prefix, else ``UNBOUNDED`` (as JuiceFS
        shows a volume without a capacity quota)."""
        quotas = await self._ask(lambda aio: aio.quotas(self.reach))
        limits = [q for q in quotas if q.max_bytes and within(self.reach, q.path)]
        if not limits:
            return UNBOUNDED, UNBOUNDED
        tight = min(limits, key=lambda q: q.max_bytes - q.bytes)
        return tight.max_bytes, max(0, tight.max_bytes - tight.bytes)


def linked(info: FileInfo | None) -> int:
    """The store's inode of a file with several names (0 for anything else)."""
    return info.inode if info is not None and info.nlink > 1 and info.is_file else 0


def _time(ns: int) -> int:
    """A time the store can hold (64-bit nanoseconds), else ``EINVAL``."""
    if not -(2**63) <= ns < 2**63:
        raise pyfuse3.FUSEError(errno.EINVAL)
    return ns


__all__ = ["ROOT", "Operations"]
