"""The node-local shard cache: one directory, every process on the node, a byte limit.

Each shard is fetched once per node: the fetcher holds an ``flock`` on the
shard's lock file, which the kernel drops if the process dies, so a crash
never leaves a lock that blocks the next run. A fill reserves its bytes
first (a temporary of the shard's full size, made under the directory's
lock, so that every process counts it), evicting the least recently used
shards to make room; the cache never holds more than its limit. The fill
streams the shard in ranged pieces through one buffer's worth of memory,
checks it against the manifest's crc32c and renames it into place; a cached
shard is checked again when it is opened, and a damaged copy is dropped and
fetched again. Readers get the shard as a read-only memory map: its pages
live once in the kernel's page cache, shared by every process and worker on
the node, and stay valid if the file is evicted meanwhile. Temporaries of
dead processes are removed.

The directory is its user's alone: the default, ``graben/datasets`` under
``$XDG_CACHE_HOME`` (else ``~/.cache``; where a home directory is a network
mount, point ``XDG_CACHE_HOME`` or ``cache_dir`` at node-local disk), is made
0700, and any directory used must be a real
directory, not a link, owned by the user and writable by no one else, or it
is refused. A cache shared by several users is not offered: a cached shard
is trusted once its crc32c matches, and a crc32c catches damage, not a
writer who means harm. The directory is opened once and every file in it
is reached from that handle, so a link planted on the way cannot redirect
it; nothing in it is opened through a link: fills are made exclusively,
0600, under random names, then renamed into place, and a link (or anything
else graben did not make) where a shard or a lock belongs is dropped.

Shards are cached in plaintext, whatever the store's encryption at rest
(they are mapped read-only, straight from the page cache): where that
matters, put the cache on an encrypted disk or on tmpfs.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import mmap
import os
import secrets
import stat
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import crc32c

from graben.store import IntegrityError, NoSpace

from ._cache_dir import open_root, private_dir
from ._manifest import Shard

LOCKS = ".locks"
TEMP = ".fill-"
FULL_WAIT_S = 60.0
"""How long a fill waits for room while other processes' fills fill the cache."""
KEY_TAIL = 200
"""Bytes of a shard's name kept in its cache file's name (a file name holds 255)."""
READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
"""How a cached shard is opened: never through a link, never waiting on a pipe."""
PIECE = 8 << 20
"""Bytes a fill fetches at a time: one request's worth, the memory a fill holds."""

Fetch = Callable[[int, int], bytes | memoryview]
"""``fetch(start, end)``: that range of a shard, from its source."""


DEFAULT_LIMIT = 100 << 30
"""The most a cache holds when no limit is given (100 GiB) ..."""


def default_limit(root: str | os.PathLike[str]) -> int:
    """... and never more than half the file system it is on."""
    where = Path(root)
    while not where.exists() and where != where.parent:  # the cache may not be made yet
        where = where.parent
    disk = os.statvfs(where)
    return min(DEFAULT_LIMIT, disk.f_blocks * disk.f_frsize // 2)


ABSENT = memoryview(b"")
"""What ``_mapped_copy`` returns when no cached file is there (compared by identity)."""


@dataclass
class CacheStats:
    """What the cache did for this process."""

    hits: int = 0
    """Shards found cached and intact."""
    fills: int = 0
    """Shards fetched into the cache."""
    bytes_fetched: int = 0
    refetched: int = 0
    """Cached shards found damaged and fetched again."""
    evicted: int = 0


@dataclass
class NodeCache:
    """Shards of datasets under ``root``, at most ``limit`` bytes of them."""

    root: Path
    limit: int | None = None
    stats: CacheStats = field(default_factory=CacheStats)
    _dir: int = field(init=False, repr=False, compare=False)
    """The directory, opened and checked once: every file in it is reached from here."""
    _locks: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self._dir = open_root(self.root)
        try:
            self._locks = private_dir(LOCKS, self.root / LOCKS, at=self._dir)
        except BaseException:
            os.close(self._dir)
            raise
        weakref.finalize(self, _close, self._dir, self._locks)

    def key(self, dataset: str, shard: Shard) -> str:
        """A file name for ``shard`` of the dataset at URL ``dataset`` (and its content)."""
        ident = f"{dataset}\0{shard.name}\0{shard.crc32c}".encode()
        digest = hashlib.blake2b(ident, digest_size=8).hexdigest()
        tail = shard.name.replace("/", "_").encode()[-KEY_TAIL:].decode(errors="ignore")
        return f"{digest}-{tail}"

    def open(self, dataset: str, shard: Shard, fetch: Fetch) -> memoryview:
        """The shard's bytes, mapped from the cache, fetched (once per node) if absent or damaged.

        ``fetch(start, end)`` returns that range of the shard from its source.
        """
        key = self.key(dataset, shard)
        view = self._cached(key, shard)
        if view is None:
            with self._locked(key):
                view = self._cached(key, shard)  # another process may have filled it meanwhile
                if view is None:
                    view = self._fill(key, shard, fetch)
                    self.stats.fills += 1
                    self.stats.bytes_fetched += shard.size
                    return view
        self.stats.hits += 1
        return view

    def warm(self, dataset: str, shard: Shard, fetch: Fetch) -> None:
        """Make sure the shard is cached (prefetch), without keeping its bytes.

        A copy of the right size counts as there: its checksum is checked when
        it is opened, and checking it here as well would read every shard twice.
        """
        try:
            st = os.stat(self.key(dataset, shard), dir_fd=self._dir, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_size == shard.size:
                return
        except FileNotFoundError:
            pass
        self.open(dataset, shard, fetch).release()

    def used(self) -> int:
        """Bytes held: cached shards and reserved fills.

        Counted under the directory's lock, which fills also take to rename
        into place: a scan racing a rename would see one file twice.
        """
        with self._directory_locked():
            return sum(size for _, size, _ in self._files())

    def clear(self) -> int:
        """Remove every cached shard not being filled; the bytes freed."""
        with self._directory_locked():
            freed = 0
            for name, size, _ in self._files():
                if not name.startswith(TEMP):
                    self._unlink(name)
                    freed += size
            return freed

    # -- internals -----------------------------------------------------------------

    def _cached(self, key: str, shard: Shard) -> memoryview | None:
        view = self._mapped_copy(key, shard.size)
        if view is ABSENT:
            # Not cached. Never unlink here: another thread or process may have
            # renamed a fresh fill into place since we looked.
            return None
        if view is not None and crc32c.crc32c(view) == shard.crc32c:
            with contextlib.suppress(FileNotFoundError):  # evicted since: the map stays valid
                os.utime(key, dir_fd=self._dir, follow_symlinks=False)  # used: evicted last
            return view
        if self._unlink(key):
            self.stats.refetched += 1  # it was damaged, or not a file of ours: fetch it again
        return None

    def _mapped_copy(self, key: str, size: int) -> memoryview | None:
        """The cached file ``key`` mapped if it is a regular file of ``size`` bytes;
        ``ABSENT`` if there is none, ``None`` if what is there is not such a file."""
        try:
            fd = os.open(key, READ, dir_fd=self._dir)
        except FileNotFoundError:
            return ABSENT
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return None  # a link: not followed, dropped by the caller
            raise
        try:
            st = os.fstat(fd)
            return _mapped(fd, size) if stat.S_ISREG(st.st_mode) and st.st_size == size else None
        finally:
            os.close(fd)

    def _fill(self, key: str, shard: Shard, fetch: Fetch) -> memoryview:
        temp = f"{TEMP}{os.getpid()}-{secrets.token_hex(8)}"  # no one can plant it beforehand
        fd = self._reserve(temp, shard.size)
        try:
            try:
                _copy(fetch, fd, shard)
                view = _mapped(fd, shard.size)  # survives the rename, and an eviction after it
            finally:
                os.close(fd)
            with self._directory_locked():  # see ``used``
                os.replace(temp, key, src_dir_fd=self._dir, dst_dir_fd=self._dir)
            return view
        except BaseException:
            self._unlink(temp)
            raise

    def _reserve(self, temp: str, size: int) -> int:
        """``temp``, ``size`` bytes long and open for writing: others count it from now on.

        A cache full of other processes' fills in progress has no room to make
        until one of them ends (then it may be evicted): wait for that, up to
        ``FULL_WAIT_S``.
        """
        deadline = time.monotonic() + FULL_WAIT_S
        while (fd := self._try_reserve(temp, size)) is None:
            if time.monotonic() > deadline:
                waited = f"the cache stayed full of fills in progress for {FULL_WAIT_S:g} s"
                raise NoSpace(waited, str(self.root))
            time.sleep(0.02)
        return fd

    def _try_reserve(self, temp: str, size: int) -> int | None:
        with self._directory_locked():
            if not self._make_room(size):
                return None
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(temp, flags, 0o600, dir_fd=self._dir)
            try:
                os.ftruncate(fd, size)
            except BaseException:
                os.close(fd)
                self._unlink(temp)
                raise
            return fd

    def _make_room(self, need: int) -> bool:
        """Evict least recently used shards until ``need`` more bytes fit; whether they do
        (not while other processes' fills in progress fill the cache)."""
        if self.limit is None:
            return True
        if need > self.limit:
            too_big = f"a shard of {need} bytes cannot fit a cache limited to {self.limit}"
            raise NoSpace(too_big, str(self.root))
        files = sorted(self._files(), key=lambda f: f[2])  # least recently used first
        used = sum(size for _, size, _ in files)
        for name, size, _ in files:
            if used + need <= self.limit:
                return True
            if name.startswith(TEMP):
                continue  # another process's fill in progress
            self._unlink(name)
            used -= size
            self.stats.evicted += 1
        return used + need <= self.limit

    def _files(self) -> Iterator[tuple[str, int, float]]:
        """``(name, size, mtime)`` of each file: cached shards and fills."""
        # a handle of its own: one shared with other scans would share its position
        fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=self._dir)
        try:
            for entry in os.scandir(fd):
                if not entry.is_file(follow_symlinks=False):
                    continue
                if entry.name.startswith(TEMP) and not _alive(entry.name):
                    self._unlink(entry.name)  # a dead process's fill
                    continue
                with contextlib.suppress(FileNotFoundError):
                    st = entry.stat(follow_symlinks=False)
                    yield entry.name, st.st_size, st.st_mtime
        finally:
            os.close(fd)

    def _unlink(self, name: str) -> bool:
        """Remove ``name`` (a link itself, never what it points at); whether it was there."""
        try:
            os.unlink(name, dir_fd=self._dir)
        except FileNotFoundError:
            return False
        return True

    def _directory_locked(self) -> contextlib.AbstractContextManager[None]:
        """The lock that reservations, renames into place and scans of the directory take."""
        return self._locked(".dir")

    @contextlib.contextmanager
    def _locked(self, name: str) -> Iterator[None]:
        fd = self._lock_file(name)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # released by the kernel if we die holding it
            yield
        finally:
            os.close(fd)

    def _lock_file(self, name: str) -> int:
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            return os.open(name, flags, 0o600, dir_fd=self._locks)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
        # A link: no process can hold a lock through it, so none is lost by removing it.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self._locks)
        return os.open(name, flags, 0o600, dir_fd=self._locks)


def _copy(fetch: Fetch, fd: int, shard: Shard) -> None:
    """Fetch the shard piece by piece into ``fd``, checking its size and crc32c."""
    pos, crc = 0, 0
    while pos < shard.size:
        piece = memoryview(fetch(pos, min(shard.size, pos + PIECE)))
        if not piece.nbytes:
            break  # the source is shorter than the manifest says
        crc = crc32c.crc32c(piece, crc)
        while piece.nbytes:
            written = os.pwrite(fd, piece, pos)
            piece, pos = piece[written:], pos + written
        del piece  # not held while the next is fetched
    if pos != shard.size or crc != shard.crc32c:
        raise IntegrityError("the shard does not match its manifest (size or crc32c)", shard.name)


def _mapped(fd: int, size: int) -> memoryview:
    """A read-only view of the file's first ``size`` bytes (the page cache's, not a copy)."""
    if size == 0:
        return memoryview(b"")
    return memoryview(mmap.mmap(fd, size, prot=mmap.PROT_READ))


def _alive(temp_name: str) -> bool:
    pid = temp_name[len(TEMP) :].split("-", 1)[0]
    if not pid.isdigit() or int(pid) == 0:
        return False  # not a fill's name: nobody's
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _close(*fds: int) -> None:
    for fd in fds:
        os.close(fd)
