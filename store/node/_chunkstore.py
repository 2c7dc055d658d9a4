"""Chunks as files on a local disk: the storage of embedded stores and data nodes.

Layout: ``ROOT/ab/cd/<id>`` (two fan-out levels of the hex id), temporaries in
``ROOT/tmp``. A write lands in a temporary, is fsynced, renamed into place and
its directory fsynced, so a chunk file either holds all of its bytes or does
not exist. crc32c is checked on write (before anything touches the disk) and
on every read. Chunks are content-addressed: a write whose bytes do not hash
(blake3) to the chunk's id is refused, so a chunk file, once there, can only
ever be replaced by the same bytes. (An embedded store's writers are in its
process and hashed the bytes they send: there crc32c alone guards them since,
and a second blake3 pass, ~40% of a large write's time here, is skipped.)
Files are the owner's alone (0600, 0700 directories). All methods block:
callers run them in worker threads.

``write_group`` stores many small chunks (``SYNCFS_MIN`` or more) with one
``syncfs`` instead of two fsyncs each (group commit for the disk; Ceph's
FileStore did the same): on this VM's disk 4 KiB files went from ~1,700/s to
~8,000/s.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import blake3

from .._errors import GrabenError, IntegrityError, NotFound, from_os_error
from .._hashing import content_id, crc32c, crc32c_combine
from .._types import ChunkRef
from ._sealed import Sealer, plain_length, sealed_length

_MAPPED = mmap.MAP_SHARED
"""How a sealed file is mapped to be opened: shared with the page cache, each page brought
in by the thread that decrypts it (faulted in side by side, not by one thread first)."""

_HEX = frozenset("0123456789abcdef")
CORES = os.cpu_count() or 1
FILE_MODE = 0o600
DIR_MODE = 0o700
STALE_TEMPORARY_S = 3600.0
"""Age after which a temporary chunk file is a dead writer's leftover."""
MIN_READ_PIECE = 1 << 20
"""Smallest piece of a chunk worth a thread of its own."""


def _is_chunk_id(name: str) -> bool:
    return len(name) == 64 and set(name) <= _HEX


GROUP_SYNC_MAX = 1 << 20
"""Chunks up to this size that arrive together share one sync of the disk (``write_group``)."""
SYNCFS_MIN = 8
"""Fewest chunks in a group worth a ``syncfs``. It writes back every dirty page of the
filesystem, other files' too (a mount's spool of a 512 MiB ``torch.save`` on the same
disk: twice the bytes written); fewer chunks are fsynced one by one."""


class LocalChunkStore:
    """Durable chunk files under one directory."""

    def __init__(
        self, root: str | Path, *, hashed_here: bool = False, sealer: Sealer | None = None
    ) -> None:
        self.root = Path(root)
        self.sealer = sealer
        """The store's key, if its chunk files are encrypted at rest (``_sealed.py``)."""
        self._scratches = threading.local()
        self._hashed_here = hashed_here
        """The writers are in this process and hashed each chunk's bytes themselves (an
        embedded store): a write checks crc32c only (a buffer changed since it was
        hashed fails that), not blake3 again. A data node takes bytes from the network:
        it checks both."""
        self._tmp = self.root / "tmp"
        self.root.mkdir(DIR_MODE, parents=True, exist_ok=True)
        self._tmp.mkdir(DIR_MODE, exist_ok=True)
        # A writer killed mid-chunk leaves its temporary; live writers' are seconds old.
        self.clean_temporaries(time.time() - STALE_TEMPORARY_S)
        self._siblings = ThreadPoolExecutor(CORES - 1 or 1, thread_name_prefix="graben-piece")

    def close(self) -> None:
        """Stop the threads that read pieces of chunks."""
        self._siblings.shutdown(wait=True)

    def path(self, chunk_id: str) -> Path:
        """Where a chunk's file lives."""
        if not _is_chunk_id(chunk_id):
            raise IntegrityError("malformed chunk id", chunk_id[:80])
        return self.root / chunk_id[:2] / chunk_id[2:4] / chunk_id

    def write(self, chunk: ChunkRef, data: memoryview) -> None:
        """Store a chunk durably; refuse it if its bytes do not match ``chunk``."""
        self._place(chunk, data, durable=True)

    def keep(self, chunk: ChunkRef, data: memoryview) -> None:
        """Store a cache's copy of a chunk: checked as a write is, not fsynced."""
        self._place(chunk, data, durable=False)

    def files(self) -> Iterator[tuple[Path, int, float]]:
        """Every chunk file: its path, size and modification time."""
        for path in self.root.glob("??/??/*"):
            if _is_chunk_id(path.name):
                with contextlib.suppress(FileNotFoundError):
                    st = path.stat()
                    yield path, st.st_size, st.st_mtime

    def evict(self, nbytes: int) -> int:
        """Delete the chunk files touched longest ago until ``nbytes`` are freed; bytes
        freed (a cache's eviction)."""
        freed = 0
        for path, size, _ in sorted(self.files(), key=lambda f: f[2]):
            if freed >= nbytes:
                break
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                freed += size
        return freed

    def write_group(self, items: Sequence[tuple[ChunkRef, memoryview]]) -> list[GrabenError | None]:
        """Store several chunks durably with one sync; each one's error or ``None``, in order.

        Nothing is durable, and so nothing may be acknowledged, before this returns.
        """
        if _syncfs is None or len(items) < SYNCFS_MIN:
            return [_error_of(self.write, chunk, data) for chunk, data in items]
        results = [_error_of(self._place, chunk, data, False) for chunk, data in items]
        try:
            _syncfs(self.root)
        except OSError as exc:
            failed = from_os_error(exc, str(self.root))
            return [failed if r is None else r for r in results]
        return results

    def _place(self, chunk: ChunkRef, data: memoryview, durable: bool) -> None:
        """Write, rename into place, and (if ``durable``) fsync the file and its directories."""
        final = self.path(chunk.id)
        if data.nbytes != chunk.length or crc32c(data) != chunk.crc32c:
            raise IntegrityError("chunk bytes do not match their crc32c; not stored", chunk.id)
        if not self._hashed_here and content_id(data) != chunk.id:
            raise IntegrityError(
                "chunk bytes do not hash (blake3) to the chunk's id; not stored", chunk.id
            )
        tmp = self._tmp / f"{chunk.id}.{os.getpid()}.{secrets.token_hex(4)}"
        if self.sealer is not None:
            out = self._scratch(sealed_length(data.nbytes) + 15)
            data = self.sealer.seal(chunk.id, data, self._siblings, out)
        try:
            self._write_file(tmp, data, durable)
            try:
                os.rename(tmp, final)
            except FileNotFoundError:
                final.parent.parent.mkdir(DIR_MODE, exist_ok=True)
                final.parent.mkdir(DIR_MODE, exist_ok=True)
                if durable:
                    _fsync_dir(final.parent.parent)
                    _fsync_dir(self.root)
                os.rename(tmp, final)
            if durable:
                _fsync_dir(final.parent)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise from_os_error(exc, str(final)) from exc

    @staticmethod
    def _write_file(path: Path, data: memoryview, durable: bool) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
        try:
            done = 0
            while done < data.nbytes:
                done += os.pwrite(fd, data[done:], done)
            os.utime(fd, ns=(time.time_ns(),) * 2)  # see ``delete``
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)

    def read(self, chunk: ChunkRef, into: memoryview) -> None:
        """Fill ``into`` (``chunk.length`` bytes) with the chunk, checking its crc32c.

        A large chunk is read and checksummed in one piece per core (this
        thread takes the first, sibling threads the rest, all on one open
        file), then verified against its one crc32c: one thread tops out near
        7 GB/s from the page cache here, two reach ~12. Smaller pieces lose it
        again to per-piece overhead, and so does a hop through the event loop
        per piece.
        """
        if self.sealer is not None:
            self._read_sealed(chunk, into)
            return
        fd = self.open_chunk(chunk)
        try:
            spans = read_spans(chunk.length)
            rest = [
                self._siblings.submit(_read_piece, fd, at, into[at : at + n]) for at, n in spans[1:]
            ]
            try:
                crc = _read_piece(fd, 0, into[: spans[0][1]])
            finally:
                pieces = [
                    future.result() for future in rest
                ]  # the fd stays open until all are done
        finally:
            os.close(fd)
        for (_, n), piece in zip(spans[1:], pieces, strict=True):
            crc = crc32c_combine(crc, piece, n)
        self.verify(chunk, crc)

    def _read_sealed(self, chunk: ChunkRef, into: memoryview) -> None:
        """A sealed chunk file opened into ``into`` straight from the page cache (mapped,
        its pages brought in at once): its segments decrypted side by side, each one's tag
        checked (a MAC under the key over every byte, so no crc32c pass besides). Read
        into a buffer first, the copy cost as much as the decryption (docs/benchmarks.md)."""
        assert self.sealer is not None
        fd = self.open_chunk(chunk)
        size = sealed_length(chunk.length)
        try:
            if os.fstat(fd).st_size != size:
                raise IntegrityError(f"sealed chunk {chunk.id} has the wrong length")
            with (
                mmap.mmap(fd, size, flags=_MAPPED, prot=mmap.PROT_READ) as mapped,
                memoryview(mapped) as sealed,
            ):
                self.sealer.open(chunk.id, sealed, into[: chunk.length], self._siblings)
        except IntegrityError as exc:
            raise IntegrityError(exc.message, str(self.path(chunk.id))) from None
        finally:
            os.close(fd)

    def _scratch(self, nbytes: int) -> memoryview:
        """This thread's buffer for sealed files, ``nbytes`` of it (kept: a fresh 8 MiB
        for every chunk cost its zeroing and page faults each time)."""
        held: bytearray | None = getattr(self._scratches, "buffer", None)
        if held is None or len(held) < nbytes:
            held = bytearray(nbytes)
            self._scratches.buffer = held
        return memoryview(held)[:nbytes]

    def open_chunk(self, chunk: ChunkRef) -> int:
        """The chunk's file, open for reading and of the chunk's length (the caller
        closes the descriptor); its bytes are not checked (``read`` checks them)."""
        path = self.path(chunk.id)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NotFound(f"chunk {chunk.id} is missing", str(path)) from None
        except OSError as exc:
            raise from_os_error(exc, str(path)) from exc
        try:
            size = sealed_length(chunk.length) if self.sealer else chunk.length
            if os.fstat(fd).st_size != size:
                raise IntegrityError(
                    f"chunk {chunk.id} has the wrong length (expected {chunk.length} bytes)",
                    str(path),
                )
        except BaseException:
            os.close(fd)
            raise
        return fd

    def intact(self, chunk_id: str) -> bool:
        """Whether a chunk file's bytes still hash to its name (what a scrubber checks).

        Chunks are content-addressed, so a node needs no metadata for this.
        """
        try:
            with open(self.path(chunk_id), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return True  # deleted meanwhile: nothing to report
        if self.sealer is not None:
            plain = memoryview(bytearray(max(0, plain_length(len(data)))))
            try:
                self.sealer.open(chunk_id, memoryview(data), plain)
            except IntegrityError:
                return False
            return blake3.blake3(plain).hexdigest() == chunk_id
        return blake3.blake3(data).hexdigest() == chunk_id

    def verify(self, chunk: ChunkRef, actual: int) -> None:
        """Raise ``IntegrityError`` naming the chunk file if ``actual`` is not its crc32c."""
        if actual != chunk.crc32c:
            raise IntegrityError(
                f"chunk {chunk.id} is corrupt: crc32c {actual:08x}, expected {chunk.crc32c:08x}",
                str(self.path(chunk.id)),
            )

    def uncached(self, chunks: Iterable[ChunkRef]) -> list[ChunkRef]:
        """Those of ``chunks`` whose files are not (all) in the page cache."""
        return [c for c in chunks if not self._cached(c)]

    def _cached(self, chunk: ChunkRef) -> bool:
        try:
            fd = os.open(self.path(chunk.id), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return True  # nothing to prefetch; the read itself will report it
        try:
            return _cached(fd, chunk.length)
        finally:
            os.close(fd)

    def prefetch(self, chunk: ChunkRef) -> None:
        """Start the kernel reading a chunk into the page cache; returns at once.

        Reading the first page of a file opened for sequential access starts
        the kernel's read-ahead of the whole file (the window, doubled by
        SEQUENTIAL, covers a chunk) and waits for that page only. Measured on
        this VM: ~2.9 GB/s cold against ~1.9 for ``POSIX_FADV_WILLNEED``,
        whose submission is nearly synchronous here.
        """
        try:
            fd = os.open(self.path(chunk.id), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return  # the read itself will report it
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            os.preadv(fd, [bytearray(4096)], 0)
        finally:
            os.close(fd)

    def inventory(self, after: str = "", limit: int | None = None) -> list[tuple[str, float]]:
        """Chunk files' ids and mtimes (including ones no metadata names), in id order:
        up to ``limit`` of them with ids after ``after``.

        The fan-out directories are walked in sorted order from the cursor's, so
        each page costs about what it returns.
        """
        found: list[tuple[str, float]] = []
        for top in _subdirs(self.root, after[:2]):
            for mid in _subdirs(top, after[2:4] if top.name == after[:2] else ""):
                for name in sorted(n for n in os.listdir(mid) if n > after and _is_chunk_id(n)):
                    with contextlib.suppress(FileNotFoundError):  # collected meanwhile
                        found.append((name, os.stat(mid / name).st_mtime))
                    if len(found) == limit:
                        return found
        return found

    def temporaries(
        self, after: str = "", limit: int | None = None
    ) -> list[tuple[str, int, float]]:
        """Files in the temporaries' directory, name order: (name, bytes, mtime); a page as
        ``inventory`` gives one. Live writers' files are seconds old; older ones are
        what killed writers left."""
        found: list[tuple[str, int, float]] = []
        for name in sorted(n for n in os.listdir(self._tmp) if n > after):
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(self._tmp / name)
                found.append((name, st.st_size, st.st_mtime))
            if len(found) == limit:
                break
        return found

    def describe_temporary(self, name: str) -> str:
        """Where a temporary lives, for reports."""
        return str(self._tmp / name)

    def delete(self, chunk_id: str, older_than: float) -> bool:
        """Delete a chunk file unless it was (re)written at or after ``older_than`` (its
        mtime: the clock's when written, not the kernel's coarse one a tick behind).

        A writer may store the same content again at any moment: the file is
        first renamed aside, and put back if the renamed copy turns out to be
        fresh (same content, so putting it back can never clobber anything).
        """
        path = self.path(chunk_id)
        aside = self._tmp / f"{chunk_id}.gc.{secrets.token_hex(4)}"
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return False
        if aside.stat().st_mtime >= older_than:
            os.rename(aside, path)
            return False
        aside.unlink()
        return True

    def clean_temporaries(self, older_than: float) -> tuple[int, int]:
        """Remove temporaries left by crashed writers: (how many, bytes freed)."""
        count = size = 0
        for entry in os.scandir(self._tmp):
            with contextlib.suppress(FileNotFoundError):  # another process swept it first
                st = entry.stat()
                if st.st_mtime < older_than:
                    os.unlink(entry.path)
                    count, size = count + 1, size + st.st_size
        return count, size

    def capacity(self) -> tuple[int, int]:
        """(free, total) bytes on the disk holding the chunks."""
        return disk_space(self.root)


def disk_space(path: Path) -> tuple[int, int]:
    """(free, total) bytes on the disk holding ``path``."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def read_spans(length: int) -> list[tuple[int, int]]:
    """(offset, length) of the pieces a chunk is read in: one per core, page-aligned."""
    pieces = max(1, min(CORES, length // MIN_READ_PIECE))
    if pieces == 1:
        return [(0, length)]
    step = -(-length // pieces)
    step += -step % 4096
    return [(at, min(step, length - at)) for at in range(0, length, step)]


def _cached(fd: int, length: int) -> bool:
    """Whether the file's last byte is in the page cache (then, most likely, all of it).

    WILLNEED walks every page even when all are cached, which cost a quarter
    of warm-read throughput; this probe costs microseconds.
    """
    try:
        os.preadv(fd, [bytearray(1)], max(0, length - 1), os.RWF_NOWAIT)
    except OSError:  # EAGAIN: not cached; EOPNOTSUPP: cannot tell
        return False
    return True


def _read_piece(fd: int, offset: int, into: memoryview, *, checksum: bool = True) -> int:
    """Fill ``into`` from ``offset``; the piece's crc32c (the length was checked), or 0
    without ``checksum``."""
    done = 0
    while done < into.nbytes:
        n = os.preadv(fd, [into[done:]], offset + done)
        if n == 0:
            raise IntegrityError("chunk file shrank while being read")
        done += n
    return crc32c(into) if checksum else 0


def write_private(path: Path, text: str) -> None:
    """A small file, 0600, whole or not at all, durably (a data directory's ids)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    _fsync_dir(path.parent)


def _subdirs(path: Path, start: str = "") -> Iterator[Path]:
    """Fan-out directories below ``path`` in name order, from the one named ``start`` on."""
    names = sorted(e.name for e in os.scandir(path) if len(e.name) == 2 and e.is_dir())
    for name in names:
        if name >= start:
            yield path / name


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # a filesystem that cannot sync directories
            raise
    finally:
        os.close(fd)


def _error_of(fn: Callable[..., None], *args: object) -> GrabenError | None:
    try:
        fn(*args)
    except GrabenError as exc:
        return exc
    return None


def _find_syncfs() -> Callable[[Path], None] | None:
    """Linux's ``syncfs(2)``, which the standard library lacks; ``None`` elsewhere."""
    try:
        call = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None

    def syncfs(path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            if call(fd) != 0:
                raise OSError(code := ctypes.get_errno(), os.strerror(code), str(path))
        finally:
            os.close(fd)

    return syncfs


_syncfs = _find_syncfs()
