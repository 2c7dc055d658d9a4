"""What every FUSE handler shares: the mount's state and the helpers over it.

``Base`` holds the open files (``OpenFile``: one per inode with open
handles, its spool while it is written), the handles (``Handle``) and the
inode table, and turns a store call into a worker-thread call (store calls
block; pyfuse3 runs on the daemon's asyncio loop, ``_aio``). ``answers_errno``
gives the kernel an errno for every error. The handlers themselves are in
``_handles`` (open files) and ``_ops`` (names, directories).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import os
import posixpath
import stat
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

import pyfuse3

from graben.store import (
    AsyncClient,
    AsyncReadFile,
    Change,
    ChangeFeed,
    Client,
    FileInfo,
    NotFound,
)

from ._aio import Tasks, in_thread
from ._blocks import Blocks, ReadAheadCounts
from ._follow import PAGE as FEED_PAGE
from ._follow import Known
from ._inodes import InodeTable, is_unlinked
from ._names import Listings, WholeDirs
from ._openers import Opener
from ._queue import ChangeQueue, Sent
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
MAX_FILE_SIZE = 1 << 44
"""The largest file (16 TiB, ext4's): a truncate past it is ``EFBIG``."""
SETTLE_S = 1.0
"""The most the change feed's reader waits for this mount's own changes to be noted."""
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
class OpenFile:
    """A file with open handles."""

    handles: int = 0
    spool: SpoolFile | None = None
    """Its content while it is open for writing."""
    created: bool = False
    """Created here and not committed yet."""
    unlinked: bool = False
    info: FileInfo | None = None
    """The committed version its read handles opened (what an unlinked file still is)."""
    permissions: int | None = None
    """Mode bits for its next commit (``None``: keep the committed version's)."""
    uid: int | None = None
    """Owner for its next commit (``None``: keep the committed version's)."""
    gid: int | None = None
    """Group for its next commit (``None``: keep the committed version's)."""
    failed: int = 0
    """The errno of a write that failed: the content is torn, and is never committed."""
    abandoned: bool = False
    """A writer died of a signal since the last commit, and nothing was written after it:
    the content is torn, and is dropped at the last close."""
    stream: Stream | None = None
    """The upload following its writes while they go front to back."""
    mtime_ns: int = field(default_factory=time.time_ns)
    mtime_set: int | None = None
    """A modification time set (utimens) since its last write: its next commit keeps it
    (``cp -p``, ``tar x`` set the time before they close)."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held while the spool is committed: its mapping must not change meanwhile."""


Entry = tuple[str, str, FileInfo | None]
"""A directory entry as a listing keeps it: name, path, what the store said of it."""


@dataclass(frozen=True, slots=True)
class Listing:
    """A directory's entries, read when it was opened (``opendir``), for its ``readdir``."""

    entries: list[Entry]
    """Its names, ``.`` and ``..`` first."""
    changes_made: int
    """``Base.changes_made`` when it was read: what this mount changed since is newer."""


@dataclass(eq=False)
class Handle:
    inode: int
    file: OpenFile
    reader: AsyncReadFile | None = None
    blocks: Blocks | None = None
    writing: bool = False
    opener: Opener | None = None
    """The process that opened it for writing, until its close (or death) was seen."""


class Base(pyfuse3.Operations):
    """A mounted store's state, and the helpers every handler uses."""

    def __init__(
        self,
        client: Client,
        spool: Spool,
        *,
        read_only: bool = False,
        timeout: float = 1.0,
        reach: str = "/",
    ) -> None:
        super().__init__()
        self.client, self.spool = client, spool
        self.read_only, self.timeout = read_only, timeout
        self.reach = reach
        """Where the mount's token may write: this store directory and below (its prefix)."""
        self.inodes = InodeTable()
        self._open: dict[int, OpenFile] = {}
        self._handles: dict[int, Handle] = {}
        self._listings: dict[int, Listing] = {}
        self._next_fh = 1
        self._versions: dict[int, tuple[int, int]] = {}
        self.listings: Listings[Entry] = Listings()
        """Directory listings answered again while nothing changed them (``_names``)."""
        self.whole = WholeDirs(self.listings)
        """Directories whose every name the daemon knows (``_names``); it tells
        ``listings`` of every change of names, here or elsewhere."""
        self.known: Known = {}
        """What the kernel was last told of each inode: a file's attributes are answered
        from here until the change feed says another client changed it (``_follow``)."""
        self.changes_made = 0
        """Changes this mount made to inodes so far (``note_own_change``)."""
        self.exact: set[int] = set()
        """Directories whose attributes in ``known`` are the store's now: read from it,
        then changed only by this mount's commits of new files in them (whose times it
        knows). Any other change in one, here or elsewhere, drops it from the set."""
        self._own_changes = 0
        """Changes of names or owners this mount has under way (``own_change``)."""
        self._quiet = asyncio.Event()
        self._quiet.set()
        self._not_weighing = asyncio.Event()
        self._not_weighing.set()
        self._uid, self._gid = os.getuid(), os.getgid()
        self.local = client.local
        """The store runs in this process (embedded)."""
        self._releases = Releases()
        self.queue = ChangeQueue(
            Sent(self._remove_each, self._set_attributes_each, self._kept, self._changed)
        )
        """Unlinks and attribute changes answered, not yet in the store (``_queue``)."""
        self.nursery: Tasks | None = None
        """Where background reads run; set by the mount before serving."""
        self.device: str | None = None
        """The mount's ``major:minor`` (tells its files from others' in ``/proc``)."""
        self.read_ahead = ReadAheadCounts()
        """What every open file's read-ahead saw (for the metrics)."""

    @property
    def open_files(self) -> int:
        """Files with open handles."""
        return len(self._open)

    @property
    def open_handles(self) -> int:
        """Handles open on files."""
        return len(self._handles)

    async def _call(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        """``fn(*args, **kwargs)`` in a worker thread: store calls block."""
        return await in_thread(fn, *args, **kwargs)

    async def _ask(self, call: Callable[[AsyncClient], Awaitable[R]]) -> R:
        """``call(client.aio)``, awaited here: the client lives on this loop (the mount
        adopted it), so a metadata call costs no thread hand-off."""
        return await call(self.client.aio)

    async def _remove_each(
        self, paths: Sequence[str], directories: Sequence[bool]
    ) -> list[BaseException | None]:
        """Remove a group of unlinked files (and emptied directories) in one call."""
        async with self.own_change():  # their rows in the feed are no other client's
            done = await self._ask(lambda aio: aio.remove_each(paths, directories=directories))
        return list(done)

    async def _set_attributes_each(
        self, changes: Sequence[tuple[str, Change]]
    ) -> Sequence[FileInfo | BaseException]:
        """Change the attributes of a group of paths in one call; what the store made of
        them is noted before the change feed may weigh their rows."""
        async with self.own_change():  # their rows in the feed are no other client's
            done = await self._ask(lambda aio: aio.set_attributes_each(changes))
            for (path, _), info in zip(changes, done, strict=True):
                inode = self.inodes.peek(path)
                if isinstance(info, FileInfo) and inode is not None:
                    self.note_own_change(inode, info)
        return done

    async def _changed(self, path: str, info: FileInfo | None) -> None:
        """The store changed ``path``'s attributes to ``info`` (the kernel holds what the
        daemon answered, a moment older), or did not (``None``: both ask again)."""
        self.listings.touch(path)
        inode = self.inodes.peek(path)
        if inode is None:
            return
        if info is not None:  # noted already (``_set_attributes_each``)
            if not info.is_dir:
                return  # what was answered, but for the ctime's nanoseconds
        else:
            self.known.pop(inode, None)
        # A directory answered from what the daemon knew may have had names made in it
        # since (its links): the kernel asks again.
        with contextlib.suppress(OSError):
            await in_thread(pyfuse3.invalidate_inode, inode, True)

    async def _kept(self, path: str) -> None:
        """The store kept ``path`` after its unlink was answered: the name is back, for
        the daemon and (its negative entry dropped) for the kernel."""
        self.whole.added(path)
        directory, _, name = path.rpartition("/")
        parent = self.inodes.peek(directory or "/")
        if parent is not None:
            with contextlib.suppress(OSError):
                await in_thread(pyfuse3.invalidate_entry, parent, os.fsencode(name))

    async def _names_settled(self) -> None:
        """Wait until the unlinks answered so far are removed from the store: a handler
        that reads or changes names sees the store as its caller's earlier calls left it."""
        await self.queue.settled()

    async def changes(self, after: int, missing: tuple[int, ...]) -> ChangeFeed:
        """The store's change feed past ``after`` (``_follow``)."""
        return await self._ask(lambda aio: aio.changes(after, missing, FEED_PAGE))

    async def current(self, path: str) -> tuple[int, int]:
        """The store inode and ctime at ``path`` now; (0, 0) if nothing is there."""
        try:
            info = await self._stat_path(path)
        except NotFound:
            return 0, 0
        return info.inode, info.ctime_ns

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

    def _writable(self, *paths: str) -> None:
        """``EROFS`` on a read-only mount; ``EACCES`` for a path its token may not write
        (the store would refuse it only at the commit, after the writer's close)."""
        if self.read_only:
            raise pyfuse3.FUSEError(errno.EROFS)
        if any(not within(path, self.reach) for path in paths):
            raise pyfuse3.FUSEError(errno.EACCES)

    def _writable_inode(self, inode: int) -> None:
        """``_writable`` for the inode's path (an unlinked file has none: it stays local)."""
        path = self.inodes.path(inode) if inode in self.inodes else None
        self._writable(*(() if path is None or is_unlinked(path) else (path,)))

    @contextlib.asynccontextmanager
    async def own_change(self) -> AsyncIterator[None]:
        """A change of names or owners this mount is making (rename, link, unlink, rmdir,
        setattr, a commit): from its commit in the store until the daemon has noted the
        answer, the change feed may already show it, and must not be taken for another
        client's. It waits while the feed is being weighed (``weighing``)."""
        await self._not_weighing.wait()
        if not self._own_changes:
            self._quiet = asyncio.Event()
        self._own_changes += 1
        try:
            yield
        finally:
            self._own_changes -= 1
            if not self._own_changes:
                self._quiet.set()

    @contextlib.asynccontextmanager
    async def weighing(self) -> AsyncIterator[None]:
        """The change feed's reader deciding what the kernel must forget: once the
        mount's own changes under way are noted (``SETTLE_S`` at most: a mount never idle
        still follows others' changes), and with none begun until it has decided, so
        what it compares (what the mount noted, what the store says now) is of one
        moment."""
        self._not_weighing = asyncio.Event()
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SETTLE_S):
                    await self._quiet.wait()
            yield
        finally:
            self._not_weighing.set()

    def note_own_change(self, inode: int, info: FileInfo) -> None:
        """This mount changed ``inode`` (chown, chmod, rename, link, a commit) and the store
        answered ``info``: the kernel learns it (a change with these is no news), and a
        store read begun before now may be older (``since``)."""
        self.known[inode] = info
        self.changes_made += 1
        if info.is_dir:
            self.exact.add(inode)
        if inode in self.inodes:
            self.listings.touch(self.inodes.path(inode))

    def names_changed_in(self, path: str) -> None:
        """This mount made or removed a name in the directory of ``path``: what the
        daemon knows of that directory's attributes is no longer the store's."""
        parent = self.inodes.peek(posixpath.dirname(path))  # (``whole`` tells ``listings``)
        if parent is not None:
            self.exact.discard(parent)

    def _newest(self, inode: int, info: FileInfo, since: int | None) -> FileInfo:
        """``info``, read from the store when ``changes_made`` was ``since``; or what this
        mount was told of ``inode`` since then, which is newer (a listing taken before a
        chown must not give the kernel the old owner)."""
        was = self.known.get(inode)
        if since is not None and since != self.changes_made and was is not None:
            return was
        self.known[inode] = info
        if info.is_dir:
            self.exact.add(inode)
        return info

    def _attrs(
        self,
        inode: int,
        info: FileInfo | None,
        file: OpenFile | None,
        *,
        since: int | None = None,
    ) -> pyfuse3.EntryAttributes:
        if info is not None:
            info = self._newest(inode, info, since)
        attrs = pyfuse3.EntryAttributes()
        attrs.st_ino = inode
        attrs.entry_timeout = attrs.attr_timeout = self.timeout
        attrs.st_mode = mode_of(info, file)
        now = time.time_ns()
        size, mtime = (info.size, info.mtime_ns) if info is not None else (0, now)
        ctime = info.ctime_ns or mtime if info is not None else now
        if file is not None and file.spool is not None:
            size, mtime = file.spool.size, file.mtime_ns
            ctime = max(ctime, mtime)
        attrs.st_size = size
        attrs.st_blocks = (size + 511) // 512
        attrs.st_blksize = BLKSIZE
        attrs.st_mtime_ns, attrs.st_ctime_ns = mtime, ctime
        attrs.st_atime_ns = info.atime_ns or mtime if info is not None else mtime
        attrs.st_nlink = info.nlink if info is not None else 1
        if file is not None and file.unlinked and self.inodes.names(inode) == 0:
            attrs.st_nlink = 0  # open, with no name left
        attrs.st_uid, attrs.st_gid = self._owner(info, file)
        attrs.st_rdev = info.rdev if info is not None else 0
        return attrs

    def _owner(self, info: FileInfo | None, file: OpenFile | None) -> tuple[int, int]:
        """Who owns it: what the store says, else the mounting user."""
        uid = info.uid if info is not None else -1
        gid = info.gid if info is not None else -1
        if file is not None:
            uid = uid if file.uid is None else file.uid
            gid = gid if file.gid is None else file.gid
        return (self._uid if uid < 0 else uid), (self._gid if gid < 0 else gid)

    async def _stat(self, inode: int, path: str) -> pyfuse3.EntryAttributes:
        file = self._open.get(inode)
        if file is not None and (file.created or file.unlinked):
            return self._attrs(inode, file.info, file)
        info, since = self.known.get(inode), self.changes_made
        if info is None or (info.is_dir and inode not in self.exact):
            info = await self._stat_path(path)  # a directory changes with every name in it
        return self._attrs(inode, info, file, since=since)

    async def _stat_path(self, path: str) -> FileInfo:
        """What the store says of ``path``.

        An embedded store answers here, on the loop's thread: one indexed SQLite
        read (WAL: never waiting on a writer) costs less than the four thread
        hand-offs of asking another thread (measured: stat from 16 threads went
        from ~1,100/s to ~4,000/s, create+fsync from ~160/s to ~260/s).
        """
        if self.local:
            return self.client.stat(path)
        return await self._ask(lambda aio: aio.stat(path))

    def _new_fh(self) -> int:
        fh, self._next_fh = self._next_fh, self._next_fh + 1
        return fh


def within(path: str, top: str) -> bool:
    """Whether the store path ``path`` is ``top`` or below it."""
    return top in ("/", path) or path.startswith(top + "/")


def mode_of(info: FileInfo | None, file: OpenFile | None) -> int:
    """``st_mode``: type and permission bits."""
    if info is not None and info.is_dir:
        return stat.S_IFDIR | info.mode
    if file is not None and file.permissions is not None:
        return stat.S_IFREG | file.permissions
    if info is None:
        return stat.S_IFREG | 0o644
    return info.mode if stat.S_IFMT(info.mode) else stat.S_IFREG | info.mode
