"""Tools workloads share: test data, page-cache control, space checks, rates.

Rules every workload follows (docs/architecture.md, "Wire"): move data through buffers
that are allocated and touched once, page-aligned (``mmap``), and never time
the making of the data.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import socket
import struct
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from graben.store import InvalidArgument, NoSpace

from ._context import Advance, Context
from ._registry import Skip

MiB = 1 << 20
BLOCK = 8 * MiB
"""Bytes per read or write call of the sequential workloads."""
PAGE = 4096
_SEED_BYTES = 64 * MiB
_STAMP = struct.Struct("<QQ")


@contextmanager
def environ(values: dict[str, str]) -> Iterator[None]:
    """``values`` set in this process's environment for the block, as they were after."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def gbps(nbytes: int, seconds: float) -> float:
    """Decimal gigabytes per second (the unit of docs/architecture.md's tables)."""
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0


@contextmanager
def random_data(ctx: Context) -> Iterator[mmap.mmap]:
    """A fixture: ``ctx.size`` incompressible bytes in one page-aligned buffer.

    Every 4 KiB page is distinct, so no two chunks of any chunk size are
    equal and graben's content-hash deduplication cannot skip any of them
    (writing one reused 8 MiB block over and over would upload it once).
    Random seed bytes are repeated and every page is stamped with a run
    nonce and its index: reading the kernel's random source for all of it
    would take longer than the workloads that use it.
    """
    need_memory(ctx.size)
    buffer = mmap.mmap(-1, max(ctx.size, 1))
    try:
        with ctx.step(f"generating {ctx.size / MiB:.0f} MiB of random data", ctx.size) as advance:
            _fill(buffer, ctx.size, advance)
        yield buffer
    finally:
        _unmap(buffer)


def _fill(buffer: mmap.mmap, size: int, advance: Advance) -> None:
    seed = os.urandom(min(size, _SEED_BYTES))
    nonce = int.from_bytes(os.urandom(8), "little")
    for start in range(0, size, len(seed)):
        end = min(size, start + len(seed))
        buffer[start:end] = seed[: end - start]
        for page in range(start, end - _STAMP.size + 1, PAGE):
            _STAMP.pack_into(buffer, page, nonce, page)
        advance(end - start)


@contextmanager
def block_buffer(_ctx: Context) -> Iterator[mmap.mmap]:
    """A fixture: one touched, page-aligned ``BLOCK``-byte buffer to read into."""
    buffer = mmap.mmap(-1, BLOCK)
    buffer.write(bytes(BLOCK))  # fault the pages in now, not inside a timed read
    try:
        yield buffer
    finally:
        _unmap(buffer)


def _unmap(buffer: mmap.mmap) -> None:
    # A view may still be alive (in a failed trial's traceback); the mapping goes with it.
    with contextlib.suppress(BufferError):
        buffer.close()


def write_all(fd: int, data: memoryview) -> None:
    """``os.write`` until all of ``data`` is written."""
    done = 0
    while done < data.nbytes:
        done += os.write(fd, data[done:])


Readinto = Callable[[memoryview], int | None]


def drain(readinto: Readinto, into: memoryview, advance: Advance) -> int:
    """Call ``readinto`` until end of file; the bytes read in all."""
    total = 0
    while n := readinto(into):
        total += n
        advance(n)
    return total


def files_under(root: Path) -> list[Path]:
    """Every regular file at or below ``root``."""
    if root.is_file():
        return [root]
    return [Path(d, name) for d, _, names in os.walk(root) for name in names]


def drop_cache(paths: Iterable[Path]) -> None:
    """Evict the files' pages from the page cache (they must be clean: written and fsynced)."""
    if not hasattr(os, "posix_fadvise"):
        raise Skip("cold reads need os.posix_fadvise, which this platform lacks")
    for path in paths:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def drop_all_caches() -> str | None:
    """Every clean page, dentry and inode out of the kernel's caches (``sync``, then
    ``drop_caches``): a FUSE mount's pages too, whatever its daemon asked the kernel to
    keep. Why not, if it could not (not root)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w", encoding="ascii") as f:
            f.write("3\n")
    except OSError as exc:
        return f"caches kept: drop_caches {exc.strerror}"
    return None


def warm_cache(paths: Iterable[Path], buffer: mmap.mmap) -> None:
    """Read the files once so that their pages are in the page cache."""
    with memoryview(buffer) as view:
        for path in paths:
            with open(path, "rb", buffering=0) as f:
                drain(f.readinto, view, lambda _n: None)


def need_space(where: Path, nbytes: int) -> None:
    """Raise ``NoSpace`` unless ``where`` has ``nbytes`` free (plus some slack)."""
    free = shutil.disk_usage(where).free
    if free < nbytes + 256 * MiB:
        raise NoSpace(
            f"the bench needs {nbytes / MiB:.0f} MiB free here and has {free / MiB:.0f} MiB; "
            "use a smaller --size or another --dir",
            str(where),
        )


def need_memory(nbytes: int) -> None:
    """Refuse to hold ``nbytes`` in memory if that would crowd out the page cache."""
    available = _mem_available()
    if available is not None and nbytes > available // 2:
        raise InvalidArgument(
            f"--size {nbytes / MiB:.0f} MiB needs more than half of the "
            f"{available / MiB:.0f} MiB of available memory; use a smaller --size"
        )


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def free_port() -> int:
    """A loopback port nobody listens on (for a server or a job's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
