"""Sequential workloads: one large file through the embedded client vs plain files.

``write`` times a durable write of ``ctx.size`` bytes in 8 MiB calls; the
reads time reading it back in 8 MiB calls into one page-aligned buffer, from
the page cache (``read-warm``) and from the disk (``read-cold``). Each trial
measures graben and its baseline on the same bytes, alternating which goes
first so that neither always inherits the other's disk state.
"""

from __future__ import annotations

import mmap
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter

from graben.store import NotFound, connect

from .._context import Context
from .._kit import (
    BLOCK,
    block_buffer,
    drain,
    drop_cache,
    files_under,
    gbps,
    need_space,
    random_data,
    warm_cache,
    write_all,
)
from .._registry import Result, workload

GRABEN = "graben embedded"
PLAIN_WRITE = "plain write+fsync"
PLAIN_READ = "plain read"
UNIT = "GB/s"
STORE_PATH = "/bench/sequential.bin"


@dataclass(frozen=True, slots=True)
class Files:
    """Where each system's copy of the file lives; shared by the sequential workloads."""

    store: Path
    """The embedded store's directory (graben's copy is ``STORE_PATH`` in it)."""
    plain: Path
    """The baseline's plain file."""

    def all(self) -> list[Path]:
        """Every file on disk behind both copies (chunks, metadata, the plain file)."""
        return [*files_under(self.store), self.plain]


def _files(ctx: Context) -> Files:
    root = ctx.shared / "sequential"
    return Files(store=root / "store", plain=root / "plain.bin")


def _in_order(ctx: Context, systems: Sequence[str]) -> list[str]:
    return list(systems) if ctx.trial % 2 == 0 else list(reversed(systems))


# -- write -------------------------------------------------------------------


@workload("write", "sequential durable write: graben embedded vs plain write+fsync")
def write(ctx: Context) -> list[Result]:
    """Time both writers on a fresh store and a fresh file."""
    data, files = ctx.fixture(random_data), _fresh(ctx)
    writers = {GRABEN: _write_graben, PLAIN_WRITE: _write_plain}
    seconds = {s: writers[s](ctx, files, data, "write") for s in _in_order(ctx, list(writers))}
    return [Result("write", s, gbps(ctx.size, seconds[s]), UNIT, PLAIN_WRITE) for s in writers]


def _fresh(ctx: Context) -> Files:
    """Remove the previous trial's copies: a store already holding the chunks would skip them."""
    files = _files(ctx)
    shutil.rmtree(files.store, ignore_errors=True)
    files.plain.unlink(missing_ok=True)
    files.store.parent.mkdir(parents=True, exist_ok=True)
    need_space(files.store.parent, 2 * ctx.size)
    return files


def _write_graben(ctx: Context, files: Files, data: mmap.mmap, label: str) -> float:
    with (
        connect(files.store) as client,
        memoryview(data) as view,
        ctx.step(f"{label}: {GRABEN}", ctx.size) as advance,
    ):
        start = perf_counter()
        with client.open(STORE_PATH, "wb") as f:
            for offset in range(0, ctx.size, BLOCK):
                advance(f.write(view[offset : offset + BLOCK]))
        return perf_counter() - start


def _write_plain(ctx: Context, files: Files, data: mmap.mmap, label: str) -> float:
    with memoryview(data) as view, ctx.step(f"{label}: {PLAIN_WRITE}", ctx.size) as advance:
        start = perf_counter()
        fd = os.open(files.plain, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            for offset in range(0, ctx.size, BLOCK):
                block = view[offset : offset + BLOCK]
                write_all(fd, block)
                advance(block.nbytes)
            os.fsync(fd)
        finally:
            os.close(fd)
        return perf_counter() - start


# -- read ----------------------------------------------------------------------

Reader = Callable[[Context, Files, mmap.mmap, str], float]


@workload("read-warm", "sequential read from the page cache: graben embedded vs plain read")
def read_warm(ctx: Context) -> list[Result]:
    """Time both readers with every page of both copies cached."""
    return _read(ctx, "read-warm", cold=False)


@workload("read-cold", "sequential read from disk: graben embedded vs plain read")
def read_cold(ctx: Context) -> list[Result]:
    """Time both readers after evicting both copies from the page cache."""
    return _read(ctx, "read-cold", cold=True)


def _read(ctx: Context, name: str, *, cold: bool) -> list[Result]:
    files, buffer = _written(ctx), ctx.fixture(block_buffer)
    readers: dict[str, Reader] = {GRABEN: _read_graben, PLAIN_READ: _read_plain}
    seconds = {}
    for system in _in_order(ctx, list(readers)):
        # Both copies, every time: neither reader may find the other's pages cached.
        if cold:
            drop_cache(files.all())
        else:
            warm_cache(files.all(), buffer)
        seconds[system] = readers[system](ctx, files, buffer, name)
    return [Result(name, s, gbps(ctx.size, seconds[s]), UNIT, PLAIN_READ) for s in readers]


def _written(ctx: Context) -> Files:
    """Both copies of the file, written now (untimed) unless ``write`` left them."""
    files = _files(ctx)
    if _stored_size(files) == ctx.size and _plain_size(files) == ctx.size:
        return files
    _fresh(ctx)
    data = ctx.fixture(random_data)
    _write_graben(ctx, files, data, "writing the file to read")
    _write_plain(ctx, files, data, "writing the file to read")
    return files


def _stored_size(files: Files) -> int | None:
    if not files.store.is_dir():
        return None
    with connect(files.store) as client:
        try:
            return client.stat(STORE_PATH).size
        except NotFound:
            return None


def _plain_size(files: Files) -> int | None:
    try:
        return files.plain.stat().st_size
    except FileNotFoundError:
        return None


def _read_graben(ctx: Context, files: Files, buffer: mmap.mmap, label: str) -> float:
    with (
        connect(files.store) as client,
        memoryview(buffer) as view,
        ctx.step(f"{label}: {GRABEN}", ctx.size) as advance,
    ):
        start = perf_counter()
        with client.open(STORE_PATH, "rb") as f:
            total = drain(f.readinto, view, advance)
        seconds = perf_counter() - start
    _check_size(GRABEN, total, ctx.size)
    return seconds


def _read_plain(ctx: Context, files: Files, buffer: mmap.mmap, label: str) -> float:
    with memoryview(buffer) as view, ctx.step(f"{label}: {PLAIN_READ}", ctx.size) as advance:
        start = perf_counter()
        with open(files.plain, "rb", buffering=0) as f:
            total = drain(f.readinto, view, advance)
        seconds = perf_counter() - start
    _check_size(PLAIN_READ, total, ctx.size)
    return seconds


def _check_size(system: str, got: int, expected: int) -> None:
    if got != expected:
        raise RuntimeError(f"{system} read {got} bytes of a {expected}-byte file")
