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
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import mmap
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import crc32c

from ._manifest import Shard

DEFAULT_DIR = Path(tempfile.gettempdir()) / "graben-dataset-cache"
"""Where the node cache is when no ``cache_dir`` is given."""
LOCKS = ".locks"
TEMP = ".fill-"
PIECE = 8 << 20
"""Bytes a fill fetches at a time: one request's worth, the memory a fill holds."""

Fetch = Callable[[int, int], bytes]
"""``fetch(start, end)``: that range of a shard, from its source."""


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

    def __post_init__(self) -> None:
        (self.root / LOCKS).mkdir(parents=True, exist_ok=True)

    def key(self, dataset: str, shard: Shard) -> str:
        """A file name for ``shard`` of the dataset at URL ``dataset`` (and its content)."""
        ident = f"{dataset}\0{shard.name}\0{shard.crc32c}".encode()
        digest = hashlib.blake2b(ident, digest_size=8).hexdigest()
        return f"{digest}-{shard.name.replace('/', '_')}"

    def open(self, dataset: str, shard: Shard, fetch: Fetch) -> memoryview:
        """The shard's bytes, mapped from the cache, fetched (once per node) if absent or damaged.

        ``fetch(start, end)`` returns that range of the shard from its source.
        """
        key = self.key(dataset, shard)
        view = self._cached(key, shard)
        if view is None:
            with self._locked(self.root / LOCKS / key):
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
            if (self.root / self.key(dataset, shard)).stat().st_size == shard.size:
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
            for path, size, _ in self._files():
                if not path.name.startswith(TEMP):
                    path.unlink(missing_ok=True)
                    freed += size
            return freed

    # -- internals -----------------------------------------------------------------

    def _cached(self, key: str, shard: Shard) -> memoryview | None:
        path = self.root / key
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            view = _mapped(fd, shard.size) if os.fstat(fd).st_size == shard.size else None
        finally:
            os.close(fd)
        if view is not None and crc32c.crc32c(view) == shard.crc32c:
            with contextlib.suppress(FileNotFoundError):  # evicted since: the map stays valid
                os.utime(path)  # recently used: evicted last
            return view
        path.unlink(missing_ok=True)  # damaged: fetch it again
        self.stats.refetched += 1
        return None

    def _fill(self, key: str, shard: Shard, fetch: Fetch) -> memoryview:
        temp = self.root / f"{TEMP}{os.getpid()}-{key}"
        fd = self._reserve(temp, shard.size)
        try:
            try:
                _copy(fetch, fd, shard)
                view = _mapped(fd, shard.size)  # survives the rename, and an eviction after it
            finally:
                os.close(fd)
            with self._directory_locked():  # see ``used``
                os.replace(temp, self.root / key)
            return view
        except BaseException:
            temp.unlink(missing_ok=True)
            raise

    def _reserve(self, temp: Path, size: int) -> int:
        """``temp``, ``size`` bytes long and open for writing: others count it from now on."""
        with self._directory_locked():
            self._make_room(size)
            fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                os.ftruncate(fd, size)
            except BaseException:
                os.close(fd)
                temp.unlink(missing_ok=True)
                raise
            return fd

    def _make_room(self, need: int) -> None:
        if self.limit is None:
            return
        if need > self.limit:
            raise OSError(f"a shard of {need} bytes cannot fit a cache limited to {self.limit}")
        files = sorted(self._files(), key=lambda f: f[2])  # least recently used first
        used = sum(size for _, size, _ in files)
        for path, size, _ in files:
            if used + need <= self.limit:
                return
            if path.name.startswith(TEMP):
                continue  # another process's fill in progress
            path.unlink(missing_ok=True)
            used -= size
            self.stats.evicted += 1
        if used + need > self.limit:
            raise OSError(f"the cache at {self.root} is full of fills in progress")

    def _files(self) -> Iterator[tuple[Path, int, float]]:
        for entry in os.scandir(self.root):
            if entry.name == LOCKS or not entry.is_file():
                continue
            if entry.name.startswith(TEMP) and not _alive(entry.name):
                Path(entry.path).unlink(missing_ok=True)  # a dead process's fill
                continue
            with contextlib.suppress(FileNotFoundError):
                st = entry.stat()
                yield Path(entry.path), st.st_size, st.st_mtime

    def _directory_locked(self) -> contextlib.AbstractContextManager[None]:
        """The lock that reservations, renames into place and scans of the directory take."""
        return self._locked(self.root / LOCKS / ".dir")

    @staticmethod
    @contextlib.contextmanager
    def _locked(path: Path) -> Iterator[None]:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # released by the kernel if we die holding it
            yield
        finally:
            os.close(fd)


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
        raise OSError(f"shard {shard.name} does not match its manifest (size or crc32c)")


def _mapped(fd: int, size: int) -> memoryview:
    """A read-only view of the file's first ``size`` bytes (the page cache's, not a copy)."""
    if size == 0:
        return memoryview(b"")
    return memoryview(mmap.mmap(fd, size, prot=mmap.PROT_READ))


def _alive(temp_name: str) -> bool:
    pid = int(temp_name[len(TEMP) :].split("-", 1)[0])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
