"""The node-local shard cache: one directory, every process on the node, a byte limit.

Each shard is fetched once per node: the fetcher holds an ``flock`` on the
shard's lock file, which the kernel drops if the process dies, so a crash
never leaves a lock that blocks the next run. A fill reserves its bytes
first (a temporary of the shard's full size, made under the directory's
lock, so that every process counts it), evicting the least recently used
shards to make room; the cache never holds more than its limit. A fill is
checked against the manifest's crc32c before it is renamed into place, and
a cached shard is checked again when it is read: a damaged copy is dropped
and fetched again. Temporaries of dead processes are removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import crc32c

from ._manifest import Shard

LOCKS = ".locks"
TEMP = ".fill-"


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
        digest = hashlib.blake2b(f"{dataset}\0{shard.crc32c}".encode(), digest_size=8).hexdigest()
        return f"{digest}-{shard.name}"

    def read(self, dataset: str, shard: Shard, fetch: Callable[[], bytes]) -> bytes:
        """The shard's bytes, from the cache, fetched (once per node) if absent or damaged."""
        key = self.key(dataset, shard)
        data = self._cached(key, shard)
        if data is not None:
            self.stats.hits += 1
            return data
        with self._locked(self.root / LOCKS / key):
            data = self._cached(key, shard)  # another process may have filled it meanwhile
            if data is not None:
                self.stats.hits += 1
                return data
            data = fetch()
            if len(data) != shard.size or crc32c.crc32c(data) != shard.crc32c:
                raise OSError(f"shard {shard.name} does not match its manifest (size or crc32c)")
            self._store(key, data)
            self.stats.fills += 1
            self.stats.bytes_fetched += len(data)
            return data

    def warm(self, dataset: str, shard: Shard, fetch: Callable[[], bytes]) -> None:
        """Make sure the shard is cached (prefetch), without keeping its bytes.

        A copy of the right size counts as there: its checksum is checked when
        it is read, and checking it here as well would read every shard twice.
        """
        try:
            if (self.root / self.key(dataset, shard)).stat().st_size == shard.size:
                return
        except FileNotFoundError:
            pass
        self.read(dataset, shard, fetch)

    def used(self) -> int:
        """Bytes held: cached shards and reserved fills.

        Counted under the directory's lock, which fills also take to rename
        into place: a scan racing a rename would see one file twice.
        """
        with self._locked(self.root / LOCKS / ".dir"):
            return sum(size for _, size, _ in self._files())

    def clear(self) -> int:
        """Remove every cached shard not being filled; the bytes freed."""
        with self._locked(self.root / LOCKS / ".dir"):
            freed = 0
            for path, size, _ in self._files():
                if not path.name.startswith(TEMP):
                    path.unlink(missing_ok=True)
                    freed += size
            return freed

    # -- internals -----------------------------------------------------------------

    def _cached(self, key: str, shard: Shard) -> bytes | None:
        path = self.root / key
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        if len(data) == shard.size and crc32c.crc32c(data) == shard.crc32c:
            with contextlib.suppress(FileNotFoundError):  # evicted since: we have the bytes
                os.utime(path)  # recently used: evicted last
            return data
        path.unlink(missing_ok=True)  # damaged: fetch it again
        self.stats.refetched += 1
        return None

    def _store(self, key: str, data: bytes) -> None:
        temp = self.root / f"{TEMP}{os.getpid()}-{key}"
        with self._locked(self.root / LOCKS / ".dir"):
            self._make_room(len(data))
            with open(temp, "wb") as f:  # the reservation: others count it from now on
                f.truncate(len(data))
        try:
            with open(temp, "r+b") as f:
                f.write(data)
            with self._locked(self.root / LOCKS / ".dir"):  # see ``used``
                os.replace(temp, self.root / key)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise

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

    @staticmethod
    @contextlib.contextmanager
    def _locked(path: Path) -> Iterator[None]:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # released by the kernel if we die holding it
            yield
        finally:
            os.close(fd)


def _alive(temp_name: str) -> bool:
    pid = int(temp_name[len(TEMP) :].split("-", 1)[0])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
