"""graben's mount beside the file systems users mount instead: JuiceFS and SeaweedFS.

Each system is mounted once for the run (``_peers``) and every workload runs
on each in turn, the order rotating with the trial. Each peer keeps as many
copies as the graben row it stands beside:

- ``graben embedded`` (one copy) beside ``JuiceFS`` (its ``file`` storage
  keeps one) and ``SeaweedFS`` (replication ``000``, one copy);
- ``graben cluster`` (three nodes, RF=3, its default) beside ``SeaweedFS 002``
  (three copies, one on each of its three volume servers).

The workloads:

- ``mount-create``: 4 KiB files created, written, fsynced and closed by 16
  threads (files/s). JuiceFS and SeaweedFS do not sync on fsync, so each has
  a durable twin: the same, then one ``sync``, its time counted.
- ``mount-stat``: ``stat`` of those files from 16 threads once the kernel's
  attribute cache has expired, so every call asks the daemon (files/s).
- ``mount-write``: one file written front to back in 1 MiB calls, closed, then
  ``sync`` (GB/s; durable on every system).
- ``mount-torch-save``: ``torch.save`` of a state dict of ``--size`` bytes,
  then fsync (GB/s), with the durable twin for the peers.
- ``mount-read`` / ``mount-read-warm``: that file read back in 1 MiB calls,
  with the system's data files evicted from the page cache (cold) or cached
  (warm); the file's own pages on the mount are evicted both times.
- ``mount-reread``: that file read once, closed, then read again in a new
  open: whether the kernel kept the pages of an unchanged file across opens.
  Its baseline is a plain file on the scratch disk re-read from the page
  cache the same way.
- ``mount-memory``: the resident memory of each system's daemons after the
  workloads above (MiB), at once and after 5 s idle (graben's daemon gives its
  chunk buffers back after 2 s without I/O).

The baseline of every table is graben's embedded mount; a system that cannot
start here leaves its rows out, with the reason printed.
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from time import perf_counter

from .. import _peers
from .._context import Context
from .._kit import (
    MiB,
    drain,
    drop_all_caches,
    drop_cache,
    files_under,
    gbps,
    need_space,
    random_data,
    warm_cache,
)
from .._peers import Mount
from .._registry import Result, Skip, workload
from .cluster import local_cluster

THREADS = 16
IDLE_S = 5.0
"""How long every mount is left idle before its memory is read again (``mount-memory``)."""
IDLE = f", idle {IDLE_S:.0f} s"
SMALL = 4096
BLOCK = 1 * MiB
EMBEDDED, CLUSTER = "graben embedded", "graben cluster"
BASELINE = EMBEDDED
PLAIN_REREAD = "plain file, page cache"
"""``mount-reread``'s baseline: a file on the scratch disk read again from the page cache."""
SYNCED = ", then sync"
"""Suffix of a non-durable system's durable twin."""


# -- the systems, mounted once per run ---------------------------------------------------

Fixture = Callable[[Context], AbstractContextManager["Mount | str"]]
"""A run-wide fixture of one system: its ``Mount``, or why it could not start."""


def _fixture(
    start: Callable[[Context], AbstractContextManager[Mount]],
) -> Callable[[Context], AbstractContextManager[Mount | str]]:
    """A run-wide fixture of one system: its ``Mount``, or why it could not start."""

    @contextmanager
    def fixture(ctx: Context) -> Iterator[Mount | str]:
        try:
            with start(ctx) as mount:
                yield mount
        except Skip as exc:
            yield str(exc)

    return fixture


SYSTEMS = {
    EMBEDDED: _fixture(lambda ctx: _peers.graben(ctx.shared / "mount-embedded")),
    CLUSTER: _fixture(
        lambda ctx: _peers.graben(
            ctx.shared / "mount-cluster",
            ctx.fixture(local_cluster),
            CLUSTER,
            data=ctx.shared / "cluster",  # where local_cluster keeps its nodes
        )
    ),
    "SeaweedFS": _fixture(lambda ctx: _peers.seaweedfs(ctx.shared / "mount-seaweedfs")),
    "SeaweedFS 002": _fixture(
        lambda ctx: _peers.seaweedfs(ctx.shared / "mount-seaweedfs-002", replication="002")
    ),
    "JuiceFS": _fixture(lambda ctx: _peers.juicefs(ctx.shared / "mount-juicefs")),
}


@contextmanager
def _target(ctx: Context) -> Iterator[Mount]:
    """A fixture: ``--target DIR`` as a mount. Whether its fsync reaches the disk is not
    known, so its write rows have a durable twin too; cold reads evict the files' own
    pages only (where its daemon keeps data is not known either)."""
    assert ctx.target_path is not None
    if not ctx.target_path.is_dir():
        raise Skip(f"--target {ctx.target_path} is not a directory")
    # The bench's files go in a directory of its own there, removed at the end of the run.
    scratch = Path(tempfile.mkdtemp(prefix=".graben-bench-", dir=ctx.target_path))
    try:
        yield Mount(f"target {ctx.target_path}", scratch, None, durable=False)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@contextmanager
def _told(_ctx: Context) -> Iterator[set[str]]:
    """A fixture: the systems whose absence this run has printed."""
    yield set()


def mounts(ctx: Context) -> list[Mount]:
    """Every system that runs here, in this trial's order (the others named once); with
    ``--target DIR``, that directory alone, started by nobody."""
    if ctx.target_path is not None:
        return [ctx.fixture(_target)]
    if ctx.target_url is not None:
        raise Skip(
            "--target is a store: the mount workloads need a mounted directory "
            f"(graben mount {ctx.target_url} DIR, then --target DIR)"
        )
    mounts = mounted(ctx, SYSTEMS, "mount workloads")
    if not mounts:
        raise Skip("no file system could be mounted here")
    return mounts


def mounted(ctx: Context, systems: Mapping[str, Fixture], label: str) -> list[Mount]:
    """The ``systems`` that mount here, in this trial's order (a rotation); each one
    that cannot is named once a run, after ``label``."""
    mounts, told = [], ctx.fixture(_told)
    for name, fixture in systems.items():
        got = ctx.fixture(fixture)
        if isinstance(got, str):
            if name not in told:
                ctx.console.print(f"{label}: {name} left out: {got}")
                told.add(name)
            continue
        mounts.append(got)
    shift = ctx.trial % (len(mounts) or 1)
    return mounts[shift:] + mounts[:shift]


def _where(ctx: Context, mount: Mount, name: str) -> Path:
    path = mount.point / f"trial{ctx.trial}" / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def sync_seconds() -> float:
    start = perf_counter()
    os.sync()
    return perf_counter() - start


def durable_rows(
    name: str,
    system: str,
    durable: bool,
    amount: float,
    seconds: float,
    unit: str,
    synced: float,
    baseline: str = BASELINE,
) -> list[Result]:
    """A system's figure (``amount`` in ``seconds``), and for one that does not sync on
    fsync its durable twin: the same with the ``synced`` seconds of one ``sync`` added."""
    scale = 1e9 if unit == "GB/s" else 1.0
    rows = [Result(name, system, amount / seconds / scale, unit, baseline)]
    if not durable:
        twin = amount / (seconds + synced) / scale
        rows.append(Result(name, system + SYNCED, twin, unit, baseline))
    return rows


# -- small files ---------------------------------------------------------------------------


@workload(
    "mount-create", "4 KiB files create+write+fsync, 16 threads: graben vs JuiceFS, SeaweedFS"
)
def mount_create(ctx: Context) -> list[Result]:
    """Files per second; the peers' durable twins end with one ``sync``."""
    count, payload = (500 if ctx.quick else 2000), os.urandom(SMALL)
    results = []
    for mount in mounts(ctx):
        where = _where(ctx, mount, "small")

        def one(i: int, where: Path = where) -> None:
            fd = os.open(where / f"f{i:05d}", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            try:
                os.write(fd, payload)
                os.fsync(fd)
            finally:
                os.close(fd)

        with ctx.step(f"mount-create: {mount.name}", count) as advance:
            seconds = _threaded(one, count, advance)
        results += durable_rows(
            "mount-create", mount.name, mount.durable, count, seconds, "files/s", sync_seconds()
        )
    return results


@workload("mount-stat", "stat of 4 KiB files, 16 threads, attribute cache expired: vs peers")
def mount_stat(ctx: Context) -> list[Result]:
    """Files per second, each ``stat`` answered by the daemon (run after ``mount-create``)."""
    count = 500 if ctx.quick else 2000
    time.sleep(1.1)  # past every kernel attribute cache (1 s on each system)
    results = []
    for mount in mounts(ctx):
        where = _where(ctx, mount, "small")
        if not (where / f"f{count - 1:05d}").exists():
            raise Skip("mount-stat stats the files mount-create makes: run both")

        def one(i: int, where: Path = where) -> None:
            os.stat(where / f"f{i:05d}")

        with ctx.step(f"mount-stat: {mount.name}", count) as advance:
            seconds = _threaded(one, count, advance)
        results.append(Result("mount-stat", mount.name, count / seconds, "files/s", BASELINE))
    return results


def _threaded(fn: Callable[[int], object], count: int, advance: Callable[[int], None]) -> float:
    """Seconds for ``THREADS`` threads to call ``fn`` on ``0..count-1``."""

    def call(i: int) -> None:
        fn(i)
        advance(1)

    start = perf_counter()
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(call, range(count)))
    return perf_counter() - start


# -- sequential ----------------------------------------------------------------------------


@workload("mount-write", "sequential write in 1 MiB calls, then sync: graben vs JuiceFS, SeaweedFS")
def mount_write(ctx: Context) -> list[Result]:
    """GB/s from the first write to the end of ``sync`` (durable everywhere)."""
    data = ctx.fixture(random_data)
    results = []
    for mount in mounts(ctx):
        if mount.data is not None:
            need_space(mount.data.parent, ctx.size)
        path = _where(ctx, mount, "seq") / "file.bin"
        with memoryview(data) as view, ctx.step(f"mount-write: {mount.name}", ctx.size) as advance:
            start = perf_counter()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                for offset in range(0, ctx.size, BLOCK):
                    advance(os.write(fd, view[offset : offset + BLOCK]))
            finally:
                os.close(fd)
            os.sync()
            seconds = perf_counter() - start
        results.append(Result("mount-write", mount.name, gbps(ctx.size, seconds), "GB/s", BASELINE))
    return results


@workload("mount-torch-save", "torch.save + fsync of --size bytes: graben vs JuiceFS, SeaweedFS")
def mount_torch_save(ctx: Context) -> list[Result]:
    """GB/s of ``torch.save`` into a file on the mount, fsynced; peers' twins add a sync."""
    import torch

    tensors = max(1, ctx.size // (64 * MiB))
    state = {f"layer{i}": torch.rand(ctx.size // tensors // 4) for i in range(tensors)}
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    results = []
    for mount in mounts(ctx):
        path = _where(ctx, mount, "torch") / "model.pt"
        with ctx.step(f"mount-torch-save: {mount.name}", 1):
            start = perf_counter()
            with open(path, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            seconds = perf_counter() - start
        results += durable_rows(
            "mount-torch-save", mount.name, mount.durable, nbytes, seconds, "GB/s", sync_seconds()
        )
        path.unlink()
    return results


@workload("mount-read", "sequential read, data files evicted: graben vs JuiceFS, SeaweedFS")
def mount_read(ctx: Context) -> list[Result]:
    """GB/s reading back ``mount-write``'s file with nothing of it in the page cache."""
    return _read(ctx, "mount-read", cold=True)


@workload("mount-read-warm", "sequential read, data files cached: graben vs JuiceFS, SeaweedFS")
def mount_read_warm(ctx: Context) -> list[Result]:
    """GB/s with the system's data files cached (the mount's own pages evicted)."""
    return _read(ctx, "mount-read-warm", cold=False)


@workload("mount-reread", "re-read, the kernel's pages kept across opens: vs a plain file")
def mount_reread(ctx: Context) -> list[Result]:
    """GB/s reading ``mount-write``'s file again in a new open after one whole read."""
    results = []
    plain = ctx.scratch / "reread.bin"
    need_space(ctx.scratch, ctx.size)
    with _buffer() as buffer, memoryview(buffer) as view:
        with open(plain, "wb") as f:
            for at in range(0, ctx.size, BLOCK):
                f.write(os.urandom(min(BLOCK, ctx.size - at)))
        files = [(PLAIN_REREAD, plain)]
        for mount in mounts(ctx):
            path = _where(ctx, mount, "seq") / "file.bin"
            if not path.exists():
                raise Skip("mount-reread reads the file mount-write makes: run both")
            files.append((mount.name, path))
        try:
            for system, path in files:
                warm_cache([path], buffer)  # the first read: its pages are in the cache now
                rate = _timed_read(ctx, "mount-reread", system, path, view)
                results.append(Result("mount-reread", system, rate, "GB/s", PLAIN_REREAD))
        finally:
            plain.unlink()
    return results


def _read(ctx: Context, name: str, *, cold: bool) -> list[Result]:
    results = []
    with _buffer() as buffer, memoryview(buffer) as view:
        for mount in mounts(ctx):
            path = _where(ctx, mount, "seq") / "file.bin"
            if not path.exists():
                raise Skip(f"{name} reads the file mount-write makes: run both")
            _evict(mount, path, buffer, cold=cold)
            rate = _timed_read(ctx, name, mount.name, path, view)
            results.append(Result(name, mount.name, rate, "GB/s", BASELINE))
    return results


def _timed_read(ctx: Context, name: str, system: str, path: Path, view: memoryview) -> float:
    """GB/s of one read of the whole ``ctx.size`` file in ``BLOCK`` calls."""
    with ctx.step(f"{name}: {system}", ctx.size) as advance:
        start = perf_counter()
        with open(path, "rb", buffering=0) as f:
            total = drain(f.readinto, view[:BLOCK], advance)
        seconds = perf_counter() - start
    if total != ctx.size:
        raise RuntimeError(f"{system} read {total} bytes, not {ctx.size}")
    return gbps(total, seconds)


def _evict(mount: Mount, path: Path, buffer: mmap.mmap, *, cold: bool) -> None:
    """The file's pages on the mount out of the cache; its data files out (cold) or in.
    As root every page goes (``drop_all_caches``), whatever a daemon asked the kernel to
    keep; elsewhere the file's own (``POSIX_FADV_DONTNEED``). What a daemon holds in its
    own memory stays (SeaweedFS's chunk cache: its warm reads run at 8-10 GB/s)."""
    if drop_all_caches() is not None:
        drop_cache([path])
    data = files_under(mount.data) if mount.data is not None else []
    data = [p for p in data if p.is_file() and not p.is_symlink()]
    if cold:
        drop_cache(data)
    else:
        warm_cache(data, buffer)


@contextmanager
def _buffer() -> Iterator[mmap.mmap]:
    buffer = mmap.mmap(-1, 16 * MiB)
    try:
        yield buffer
    finally:
        buffer.close()


@workload("mount-memory", "resident memory of each system's daemons after the mount workloads")
def mount_memory(ctx: Context) -> list[Result]:
    """MiB resident in the processes that serve each mount (lower is better): at once, and
    again once every mount has been idle ``IDLE_S`` (what a mount left running holds)."""
    serving = [m for m in mounts(ctx) if m.pids]
    busy = [
        Result("mount-memory", m.name, _peers.rss(m.pids) / MiB, "MiB", BASELINE) for m in serving
    ]
    time.sleep(IDLE_S)
    idle = [
        Result("mount-memory", f"{m.name}{IDLE}", _peers.rss(m.pids) / MiB, "MiB", BASELINE + IDLE)
        for m in serving
    ]
    return busy + idle
