"""The FUSE door beside the direct client: sequential write and read, small files.

Every figure is the mount next to the store's own client doing the same thing
to a store of the same kind (embedded, on this disk), in the same trial:

- ``fuse-write``: a new file written front to back in 1 MiB and 4 MiB
  ``os.write`` calls, closed (which commits it), against ``Client.open(path,
  "wb")`` taking the same blocks. Each system writes into a fresh store of its
  own, so neither finds the other's chunks already stored.
- ``fuse-read``: the same file read back in 1 MiB and 4 MiB calls, from disk
  (every chunk file, and the mount's own page cache of the file, evicted
  first) and with the chunk files in the page cache (``fuse-read-warm``: the
  mount's copy of the file still evicted, so the daemon serves every byte).
- ``fuse-small``: 4 KiB files created, written and closed one by one, then
  ``stat`` ed, in files per second, against ``put`` and ``stat``.
"""

from __future__ import annotations

import mmap
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter

from graben.store import Client, connect

from .. import _peers
from .._context import Context
from .._kit import (
    MiB,
    block_buffer,
    drain,
    drop_cache,
    files_under,
    gbps,
    need_space,
    random_data,
    warm_cache,
)
from .._registry import Result, workload

BLOCKS = (1 * MiB, 4 * MiB)
FILE = "/bench/fuse.bin"
SMALL = 4096
UNIT = "GB/s"


def _systems(block: int) -> tuple[str, str]:
    size = f"{block // MiB} MiB calls"
    return f"FUSE mount, {size}", f"direct client, {size}"


@dataclass(frozen=True, slots=True)
class Mounted:
    """An embedded store and its mount."""

    store: Path
    point: Path


@contextmanager
def _mounted(root: Path) -> Iterator[Mounted]:
    """A fresh embedded store under ``root``, mounted; unmounted (daemon gone) on exit."""
    with _peers.graben(root) as mount:
        yield Mounted(root / "store", mount.point)


def _rate(name: str, system: str, size: int, seconds: float, baseline: str) -> Result:
    return Result(name, system, gbps(size, seconds), UNIT, baseline)


def _in_order(ctx: Context, systems: list[str]) -> list[str]:
    return systems if ctx.trial % 2 == 0 else systems[::-1]


# -- write -----------------------------------------------------------------------


@workload("fuse-write", "sequential write through a FUSE mount vs the direct client")
def fuse_write(ctx: Context) -> list[Result]:
    """Each block size: the mount and the client, each into a fresh store of its own."""
    data = ctx.fixture(random_data)
    need_space(ctx.scratch, 2 * ctx.size)
    results = []
    for block in BLOCKS:
        mounted_, direct = _systems(block)
        seconds = {}
        for system in _in_order(ctx, [mounted_, direct]):
            root = ctx.scratch / f"write-{block}-{'fuse' if system == mounted_ else 'direct'}"
            if system == mounted_:
                with _mounted(root) as m:
                    seconds[system] = _write_mount(ctx, m, data, block, system)
            else:
                with connect(root / "store") as client:
                    seconds[system] = _write_client(ctx, client, data, block, system)
                shutil.rmtree(root, ignore_errors=True)
        results += [_rate("fuse-write", s, ctx.size, seconds[s], direct) for s in seconds]
    return results


def _write_mount(ctx: Context, m: Mounted, data: mmap.mmap, block: int, label: str) -> float:
    path = m.point / FILE.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    with memoryview(data) as view, ctx.step(f"fuse-write: {label}", ctx.size) as advance:
        start = perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            for offset in range(0, ctx.size, block):
                advance(os.write(fd, view[offset : offset + block]))
        finally:
            os.close(fd)  # commits
        return perf_counter() - start


def _write_client(ctx: Context, client: Client, data: mmap.mmap, block: int, label: str) -> float:
    with memoryview(data) as view, ctx.step(f"fuse-write: {label}", ctx.size) as advance:
        start = perf_counter()
        with client.open(FILE, "wb") as f:
            for offset in range(0, ctx.size, block):
                advance(f.write(view[offset : offset + block]))
        return perf_counter() - start


# -- read --------------------------------------------------------------------------


@contextmanager
def _read_store(ctx: Context) -> Iterator[Mounted]:
    """A fixture: one mounted store holding the file, written once by the client."""
    root = ctx.shared / "fuse-read"
    need_space(ctx.shared, ctx.size)
    with _mounted(root) as m:
        data = ctx.fixture(random_data)
        with connect(m.store) as client, memoryview(data) as view:
            client.put(FILE, view)
        yield m


@workload("fuse-read", "sequential read from disk through a FUSE mount vs the direct client")
def fuse_read(ctx: Context) -> list[Result]:
    """Both from disk: the chunk files and the mount's cached pages evicted before each read."""
    return _read(ctx, "fuse-read", cold=True)


@workload("fuse-read-warm", "sequential read of a cached store through a mount vs the client")
def fuse_read_warm(ctx: Context) -> list[Result]:
    """Chunk files in the page cache; the mount's own cached pages evicted, so the daemon serves."""
    return _read(ctx, "fuse-read-warm", cold=False)


def _read(ctx: Context, name: str, *, cold: bool) -> list[Result]:
    m, buffer = ctx.fixture(_read_store), ctx.fixture(block_buffer)
    chunks, through = files_under(m.store / "chunks"), m.point / FILE.lstrip("/")
    results = []
    with connect(m.store) as client:
        for block in BLOCKS:
            mounted_, direct = _systems(block)
            seconds = {}
            for system in _in_order(ctx, [mounted_, direct]):
                drop_cache([through])
                if cold:
                    drop_cache(chunks)
                else:
                    warm_cache(chunks, buffer)
                with memoryview(buffer) as view, ctx.step(f"{name}: {system}", ctx.size) as advance:
                    start = perf_counter()
                    if system == mounted_:
                        with open(through, "rb", buffering=0) as f:
                            total = drain(f.readinto, view[:block], advance)
                    else:
                        with client.open(FILE, "rb") as f:
                            total = drain(f.readinto, view[:block], advance)
                    seconds[system] = perf_counter() - start
                if total != ctx.size:
                    raise RuntimeError(f"{system} read {total} bytes, not {ctx.size}")
            results += [_rate(name, s, ctx.size, seconds[s], direct) for s in seconds]
    return results


# -- small files ---------------------------------------------------------------------


@workload("fuse-small", "4 KiB files created and stat'ed through a FUSE mount vs the client")
def fuse_small(ctx: Context) -> list[Result]:
    """Files per second: create+write+close, then stat, each system in a fresh store."""
    count = 500 if ctx.quick else 2000
    payload = os.urandom(SMALL)
    rates: dict[str, float] = {}
    for kind in _in_order(ctx, ["fuse", "direct"]):
        root = ctx.scratch / f"small-{kind}"
        if kind == "fuse":
            with _mounted(root) as m:
                rates.update(_small_mount(ctx, m.point / "small", payload, count))
        else:
            with connect(root / "store") as client:
                rates.update(_small_client(ctx, client, payload, count))
            shutil.rmtree(root, ignore_errors=True)
    return [
        Result("fuse-small", "FUSE create+write+close", rates["fc"], "files/s", "direct put"),
        Result("fuse-small", "direct put", rates["dc"], "files/s", "direct put"),
        Result("fuse-small", "FUSE stat", rates["fs"], "files/s", "direct stat"),
        Result("fuse-small", "direct stat", rates["ds"], "files/s", "direct stat"),
    ]


def _small_mount(ctx: Context, where: Path, payload: bytes, count: int) -> dict[str, float]:
    where.mkdir()
    with ctx.step("fuse-small: FUSE create", count) as advance:
        start = perf_counter()
        for i in range(count):
            (where / f"f{i:05d}").write_bytes(payload)
            advance(1)
        created = count / (perf_counter() - start)
    time.sleep(1.1)  # past the kernel's attribute cache: each stat asks the daemon
    with ctx.step("fuse-small: FUSE stat", count) as advance:
        start = perf_counter()
        for i in range(count):
            os.stat(where / f"f{i:05d}")
            advance(1)
        stated = count / (perf_counter() - start)
    return {"fc": created, "fs": stated}


def _small_client(ctx: Context, client: Client, payload: bytes, count: int) -> dict[str, float]:
    with ctx.step("fuse-small: direct put", count) as advance:
        start = perf_counter()
        for i in range(count):
            client.put(f"/small/f{i:05d}", payload)
            advance(1)
        created = count / (perf_counter() - start)
    with ctx.step("fuse-small: direct stat", count) as advance:
        start = perf_counter()
        for i in range(count):
            client.stat(f"/small/f{i:05d}")
            advance(1)
        stated = count / (perf_counter() - start)
    return {"dc": created, "ds": stated}
