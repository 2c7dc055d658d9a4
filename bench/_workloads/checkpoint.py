"""Checkpoint workloads: DCP save and load with 2 real gloo ranks, beside DCP's own writers.

Each system runs as a 2-rank job (``_dcp_job``, one process per rank); the
job times its save or load between barriers and reports the slower rank.
Systems: DCP's ``FileSystemWriter`` on the local disk (the baseline), its
``FsspecWriter`` over ``graben://`` (the cluster) and over s3fs to moto,
s3torchconnector's ``S3StorageWriter``/``Reader`` (AWS's S3 connector for
PyTorch, with its defaults: one writer thread per rank) to the same moto,
and ``GrabenWriter`` on an embedded store and on the 3-node cluster (one copy,
and three); and
DCP's ``FileSystemWriter``/``Reader`` on each mount of the run (graben's,
JuiceFS's, and SeaweedFS's at one copy and at three; started by
``mounts``). Every save to a file fsyncs (one to S3 is done when its PUTs
return); on the mounts that ignore fsync (the peers) a twin row ends with
one ``sync``, its time counted. ``ctx.size`` bytes are saved across the two
ranks. Targets (issue "Checkpoint door"): save >= 1.0x and load >= 1.0x
DCP's file system writer and reader; an incremental save with 10% changed
>= 5x faster than a full one; async save blocks <= 100 ms per GiB per rank.

A thousand ranks (``ckpt-ranks``): ``_ranks``.

Planning at scale (``ckpt-plan``): 4096 simulated ranks x 300 tensors in one process.

``_plan_sim`` runs the real planner and writer calls of ``dcp.save`` for
every simulated rank (collectives and tensor data left out) and times the
critical path: a rank's own work counted once (it runs on every rank at
once), the coordinator's whole. Two saves of the same layout each, for
``GrabenSavePlanner`` + ``GrabenWriter`` and for DCP's ``DefaultSavePlanner``
+ ``FileSystemWriter``; then one rank's metadata read and load plan for
``GrabenLoadPlanner`` + ``GrabenReader`` and DCP's reader. Target (issue
"Checkpoint door"): planning + commit <= 1 s after the first save.
``--quick`` simulates 1024 ranks.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from graben.store import NotFound, connect, split_url

from .._context import Context
from .._kit import drop_all_caches, free_port, gbps
from .._peers import Mount
from .._registry import Result, Skip, workload
from .cluster import local_cluster
from .fsspec import aws_env, moto_s3
from .mounts import durable_rows, mounts, sync_seconds

if TYPE_CHECKING:  # torch, imported by the workloads that run it: --list stays quick
    from .._plan_sim import Kind
    from .._ranks import Outcome

T = TypeVar("T")
GBPS = "GB/s"
WORLD = 2
RF1 = {"replication": 1}
"""One copy, as on the local disk (RF=3 writes three to this VM's one disk)."""
JOB = (sys.executable, "-m", "graben.bench._dcp_job")
BASELINE = "DCP FileSystemWriter (local disk)"
READ_BASELINE = "DCP FileSystemReader (local disk)"


@dataclass(frozen=True)
class System:
    """One way of saving: a name, the job's ``system`` key, where it saves and with what."""

    name: str
    """What the report calls it."""
    key: str
    """``_dcp_job``'s system key."""
    target: str
    """Path or URL of the checkpoint, ``{}`` replaced by a per-save name."""
    options: dict[str, Any] = field(default_factory=dict)
    """fsspec storage options."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment of the ranks."""
    durable: bool = True
    """Whether a save is on disk when it returns (else the row has a twin ending in
    one ``sync``: JuiceFS and SeaweedFS mounts do not sync on fsync)."""


def _systems(ctx: Context, url: str, s3: Any) -> list[System]:
    s3_options = dict(s3.storage_options)  # how the moto fixture reaches its server
    home = str(ctx.shared / "ckpt-home")
    return [
        System(BASELINE, "fs", str(ctx.shared / "ckpt-fs" / "{}")),
        System(
            "DCP FsspecWriter -> graben:// cluster RF=1",
            "fsspec",
            f"{url}/bench-ckpt/fsspec-{{}}",
            RF1,
        ),
        System("DCP FsspecWriter -> s3fs -> moto", "fsspec-s3", "s3://bench/ckpt-{}", s3_options),
        System(
            "DCP S3StorageWriter (s3torchconnector) -> moto",
            "s3torch",
            "s3://bench/s3torch-{}",
            env=aws_env(s3_options),  # S3StorageWriter/Reader take no endpoint: its client
            # reads AWS_ENDPOINT_URL when none is given
        ),
        System(
            "GrabenWriter embedded", "graben", "graben:///bench-ckpt/{}", env={"GRABEN_HOME": home}
        ),
        _graben_cluster(url),
        _graben_cluster(url, copies=3),
        *(
            System(
                f"DCP FileSystemWriter -> {mount.name} mount",
                "fs",
                str(mount.point / "bench-ckpt" / "{}"),
                durable=mount.durable,
            )
            for mount in _mounted(ctx)
        ),
    ]


def _graben_cluster(url: str, copies: int = 1) -> System:
    """GrabenWriter on the run's cluster, one copy (also ckpt-incremental's and ckpt-async's)
    or three on three nodes: on this VM's one disk, three times the bytes of the local
    disk's save (its target: 1.0x a third of the baseline's figure)."""
    name, root = f"GrabenWriter cluster RF={copies}", f"{url}/bench-ckpt/graben{copies}-{{}}"
    return System(name, "graben", root, {"replication": copies})


def _mounted(ctx: Context) -> list[Mount]:
    """The run's mounts (graben's and its peers'), or none if nothing mounts here."""
    try:
        return sorted(mounts(ctx), key=lambda mount: mount.name)
    except Skip:
        return []


def job(
    ctx: Context, system: System, action: str, name: str, seed: int = 0, world: int = WORLD
) -> dict[str, float]:
    """Run one job of ``world`` ranks; rank 0's report.

    Several ranks run with ``OMP_NUM_THREADS=1``, as ``torchrun`` starts them
    when a node runs several (set before they start: torch reads it once,
    at import); a lone rank keeps torch's default.
    """
    env = {**({"OMP_NUM_THREADS": "1"} if world > 1 else {}), **system.env}
    spec = {
        "system": system.key,
        "action": action,
        "target": system.target.format(name),
        "bytes_per_rank": ctx.size // WORLD,
        "storage_options": system.options,
        "env": env,
        "seed": seed,
    }
    return rank_job(JOB, spec, world, env, f"{system.name} {action}")


def rank_job(
    job: tuple[str, ...], spec: dict[str, Any], world: int, env: dict[str, str], what: str
) -> dict[str, float]:
    """Run ``job SPEC RANK WORLD PORT`` as ``world`` processes (``env`` added to ours);
    rank 0's report (the ``_dcp_job.main`` protocol)."""
    port = free_port()
    procs = [
        subprocess.Popen(
            [*job, json.dumps(spec), str(r), str(world), str(port)],
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]
    outputs = [p.communicate(timeout=600) for p in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        if proc.returncode:
            raise RuntimeError(f"{what} failed:\n{err[-3000:]}")
    report: dict[str, float] = json.loads(outputs[0][0].strip().splitlines()[-1])
    return report


def _remove(system: System, name: str, s3: Any) -> None:
    """Delete a saved checkpoint and its warm-up (a live copy would let the next save dedup)."""
    for target in (system.target.format(name), system.target.format(name) + "-warmup"):
        _remove_one(system, target, s3)


def _remove_one(system: System, target: str, s3: Any) -> None:
    if system.key == "fs":
        shutil.rmtree(target, ignore_errors=True)
    elif system.key in ("fsspec-s3", "s3torch"):
        with suppress(FileNotFoundError):
            s3.rm(target, recursive=True)
    else:
        store, path = split_url(target)
        with connect(system.env.get("GRABEN_HOME", store)) as client, suppress(NotFound):
            client.rm(path, recursive=True)


SETTLE_S = 3.0
"""Pause before each timed job: this VM's disk runs a job right after another
one up to 20% slower (its burst budget), whichever system comes second."""


def _settle(*, free_memory: bool = False) -> None:
    """Written pages on disk, a pause; with ``free_memory``, the page cache emptied too
    (as root): a save's copy into the page cache runs 5-10x slower in the kernel when it
    must first reclaim pages (measured: the same 512 MiB ``dcp.save`` took 1.0 s of
    system time with the cache full, 0.11 s with pages free), so without it a system
    pays for the pages the one before it left cached."""
    if not free_memory or drop_all_caches() is not None:
        os.sync()
    time.sleep(SETTLE_S)


def _rotated(ctx: Context, systems: list[T]) -> list[T]:
    """Systems in an order that starts one further each trial: none is always first."""
    start = ctx.trial % len(systems)
    return systems[start:] + systems[:start]


@workload("ckpt-save", "DCP save, 2 gloo ranks: GrabenWriter vs DCP's writers (disk, fsspec)")
def ckpt_save(ctx: Context) -> list[Result]:
    """Each system saves ``ctx.size`` bytes (half per rank) to a fresh checkpoint."""
    url, s3 = ctx.fixture(local_cluster), ctx.fixture(moto_s3)
    results = []
    systems = _systems(ctx, url, s3)
    for seed, system in _rotated(ctx, list(enumerate(systems))):
        name = f"save-{ctx.trial}"
        _settle(free_memory=True)
        with ctx.step(f"dcp.save: {system.name}", ctx.size) as tick:
            seconds = job(ctx, system, "save", name, seed)["seconds"]
            synced = 0.0 if system.durable else sync_seconds()
            tick(ctx.size)
        _remove(system, name, s3)
        results += durable_rows(
            "ckpt-save", system.name, system.durable, ctx.size, seconds, GBPS, synced, BASELINE
        )
    return results


@contextmanager
def saved(ctx: Context) -> Iterator[list[System]]:
    """A fixture: one checkpoint per system, saved once (untimed) for the load trials."""
    url, s3 = ctx.fixture(local_cluster), ctx.fixture(moto_s3)
    systems = _systems(ctx, url, s3)
    for seed, system in enumerate(systems):
        with ctx.step(f"dcp.save for loads: {system.name}", ctx.size) as tick:
            job(ctx, system, "save", "for-load", seed)
            tick(ctx.size)
    yield systems


@workload("ckpt-load", "DCP load, 2 gloo ranks: GrabenReader vs DCP's readers (disk, fsspec)")
def ckpt_load(ctx: Context) -> list[Result]:
    """Each system loads the checkpoint it saved into preallocated tensors (values checked)."""
    results = []
    for seed, system in _rotated(ctx, list(enumerate(ctx.fixture(saved)))):
        _settle()
        with ctx.step(f"dcp.load: {system.name}", ctx.size) as tick:
            seconds = job(ctx, system, "load", "for-load", seed)["seconds"]
            tick(ctx.size)
        name = system.name.replace("Writer", "Reader")
        results.append(Result("ckpt-load", name, gbps(ctx.size, seconds), GBPS, READ_BASELINE))
    return results


@workload("ckpt-incremental", "GrabenWriter: a save with 10% of tensors changed vs a full save")
def ckpt_incremental(ctx: Context) -> list[Result]:
    """Full save, then the same state with 10% of its tensors changed, on the cluster."""
    url, s3 = ctx.fixture(local_cluster), ctx.fixture(moto_s3)
    system = _graben_cluster(url)
    name = f"incr-{ctx.trial}"
    _settle()
    with ctx.step("dcp.save full, then incremental", 2 * ctx.size) as tick:
        report = job(ctx, system, "incremental", name)
        tick(2 * ctx.size)
    _remove(system, name, s3)
    full, incremental = "GrabenWriter full save", "GrabenWriter incremental (10% changed)"
    return [
        Result("ckpt-incremental", full, gbps(ctx.size, report["full"]), GBPS, full),
        Result("ckpt-incremental", incremental, gbps(ctx.size, report["incremental"]), GBPS, full),
    ]


@workload("ckpt-async", "CheckpointManager async save: ms the loop blocks per GiB per rank")
def ckpt_async(ctx: Context) -> list[Result]:
    """Blocking time of an async save (staging into reused host buffers) beside a sync save.

    With 2 ranks (one core each here) and with 1 (both cores). Beside each,
    the floor: a plain ``copy_`` of the same tensors by the same ranks.
    """
    url, s3 = ctx.fixture(local_cluster), ctx.fixture(moto_s3)
    system = _graben_cluster(url)
    root = System(system.name, "graben", f"{url}/bench-async-{{}}", RF1)
    gib_per_rank = ctx.size / WORLD / 2**30
    blocked, copy = {}, {}
    for world in (WORLD, 1):
        with ctx.step(f"async save, {world} rank(s): blocking time", ctx.size) as tick:
            report = job(ctx, root, "async", f"{ctx.trial}-{world}", world=world)
            blocked[world] = report["blocked"] * 1e3 / gib_per_rank
            copy[world] = report["copy"] * 1e3 / gib_per_rank
            tick(ctx.size)
    with ctx.step("sync save", ctx.size) as tick:
        sync = job(ctx, system, "save", f"sync-{ctx.trial}")["seconds"] * 1e3 / gib_per_rank
        tick(ctx.size)
    _remove(system, f"sync-{ctx.trial}", s3)
    with connect(url) as client:
        for world in (WORLD, 1):
            client.rm(f"/bench-async-{ctx.trial}-{world}", recursive=True)
    name, unit, sync_name = "ckpt-async", "ms/GiB/rank", f"sync save, {WORLD} ranks"
    results = [Result(name, sync_name, sync, unit, sync_name)]
    for world, ranks in ((WORLD, f"{WORLD} ranks"), (1, "1 rank")):
        floor = f"plain copy_ of the same tensors, {ranks}"
        results.append(Result(name, floor, copy[world], unit, floor))
        results.append(Result(name, f"async save, {ranks}: blocked", blocked[world], unit, floor))
    return results


# -- planning at scale ------------------------------------------------------------

TENSORS = 300
UNIT = "s"
STOCK = "DCP DefaultSavePlanner + FileSystemWriter"
GRABEN = "GrabenSavePlanner + GrabenWriter"
STOCK_LOAD = "DCP DefaultLoadPlanner + FileSystemReader: one rank's metadata + plan"
GRABEN_LOAD = "GrabenLoadPlanner + GrabenReader: one rank's metadata + plan"


def _world(ctx: Context) -> int:
    return 1024 if ctx.quick else 4096


def _saves(ctx: Context, kind: Kind, world: int) -> tuple[float, float]:
    """(first save, second save) seconds of planning + commit."""
    from .._plan_sim import simulate_saves

    with ctx.step(f"{world} simulated ranks: {kind.name}, 2 saves", 2) as tick:
        times = []
        for save in simulate_saves(kind, world, TENSORS, 2):
            times.append(save.total)
            tick(1)
    return times[0], times[1]


@workload("ckpt-plan", "DCP planning + commit, 4096 simulated ranks x 300 tensors (s)")
def ckpt_plan(ctx: Context) -> list[Result]:
    """Both planners twice on the same layout; then a load plan on three ranks each."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    from graben.checkpoint import GrabenReader

    from .._plan_sim import graben_kind, quiet_gc, simulate_load, stock_kind

    world, store = _world(ctx), ctx.scratch / "store"
    with connect(str(store)) as client, quiet_gc():
        graben = _saves(ctx, graben_kind(client, "/plan"), world)
        stock = _saves(ctx, stock_kind(ctx.scratch / "fs"), world)
        ranks = (0, world // 2, world - 1)
        with ctx.step("one rank's load plan, 3 ranks each", 2 * len(ranks)) as tick:
            graben_load = statistics.median(
                simulate_load(
                    GrabenReader("graben:///plan/step-1", client=client), r, world, TENSORS
                )[0]
                for r in ranks
            )
            tick(len(ranks))
            stock_load = statistics.median(
                simulate_load(FileSystemReader(ctx.scratch / "fs" / "step-1"), r, world, TENSORS)[0]
                for r in ranks
            )
            tick(len(ranks))
    later, first = f"save after the first, {world} ranks", f"first save, {world} ranks"
    return [
        Result("ckpt-plan", f"{STOCK}: {later}", stock[1], UNIT, f"{STOCK}: {later}"),
        Result("ckpt-plan", f"{GRABEN}: {later}", graben[1], UNIT, f"{STOCK}: {later}"),
        Result("ckpt-plan", f"{STOCK}: {first}", stock[0], UNIT, f"{STOCK}: {first}"),
        Result("ckpt-plan", f"{GRABEN}: {first}", graben[0], UNIT, f"{STOCK}: {first}"),
        Result("ckpt-plan", STOCK_LOAD, stock_load, UNIT, STOCK_LOAD),
        Result("ckpt-plan", GRABEN_LOAD, graben_load, UNIT, STOCK_LOAD),
    ]


# -- a thousand ranks at once --------------------------------------------------------

RANK_PROCESSES = 4
GRABEN_RANKS = "graben cluster RF=3"


def _ranks(ctx: Context) -> int:
    return 256 if ctx.quick else 1024


@workload("ckpt-ranks", "1,024 ranks save a 64 KiB shard each, then load it (s, connections)")
def ckpt_ranks(ctx: Context) -> list[Result]:
    """Every rank through GrabenWriter's and GrabenReader's calls at once (``_ranks``), on
    the run's cluster (its default, RF=3: every rank connects to every node) beside DCP's
    FileSystemWriter/Reader on the local disk driven the same way; and the connections
    the servers held."""
    from .._ranks import Storage, save_and_load

    url, world = ctx.fixture(local_cluster), _ranks(ctx)
    seed = 1000 * ctx.trial + 1  # other bytes each trial: the store skips chunks it holds
    systems = {
        GRABEN_RANKS: Storage(url, f"/bench-ranks-{ctx.trial}", replication=3),
        "DCP FileSystemWriter/Reader, local disk": Storage("", str(ctx.scratch / "ranks")),
    }
    outcomes: dict[str, Outcome] = {}
    for name, storage in _rotated(ctx, list(systems.items())):
        with ctx.step(f"{world} ranks: save and load, {name}", 2) as tick:
            outcomes[name] = save_and_load(storage, world, RANK_PROCESSES, seed=seed)
            tick(2)
    with connect(url) as client:
        for suffix in ("", "-warmup"):
            client.rm(f"/bench-ranks-{ctx.trial}{suffix}", recursive=True)
    shutil.rmtree(ctx.scratch / "ranks", ignore_errors=True)
    shutil.rmtree(ctx.scratch / "ranks-warmup", ignore_errors=True)
    name, stock = "ckpt-ranks", "DCP FileSystemWriter/Reader, local disk"
    results = []
    for what, value in (("first byte to published", "publish_s"), ("load, every byte", "load_s")):
        base = f"{stock}: {world} ranks, {what}"
        for system, outcome in outcomes.items():
            row = f"{system}: {world} ranks, {what}"
            results.append(Result(name, row, getattr(outcome, value), UNIT, base))
    base = f"{stock}: CPU per published rank, every process"
    for system, outcome in outcomes.items():
        row = f"{system}: CPU per published rank, every process"
        results.append(Result(name, row, 1000 * outcome.cpu_s / world, "ms", base))
    held = outcomes[GRABEN_RANKS].connections
    metas, nodes = list(held.values())[:1], list(held.values())[1:]
    for row, count in (
        ("graben cluster: metadata service held", sum(metas)),
        ("graben cluster: each data node held (least)", min(nodes, default=0)),
    ):
        results.append(Result(name, row, float(count), "connections", row))
    return results
