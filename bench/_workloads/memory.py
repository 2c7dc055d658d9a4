"""The memory tier: a node's agent beside the copy it stands for and the store behind it.

One agent (``graben agent serve``, in ``/dev/shm``) for the run
(``memory_agent``), and 2-rank jobs (``_memory_job``, one process per rank)
on the run's cluster. Targets (issue "Checkpoints in memory first"): a save
blocks <= 1.1x a plain ``copy_`` of the same tensors; a restarted job loads
from memory >= 5x faster than ``GrabenReader`` from the cluster; a small
model saved every step runs <= 1.05x the step time of the same loop without
checkpoints.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from graben.store import AgentClient, connect
from graben.store.local import make_secret_file

from .._context import Context
from .._kit import environ, free_port, gbps
from .._registry import Result, Skip, workload
from .checkpoint import rank_job
from .cluster import local_cluster

WORLD = 2
JOB = (sys.executable, "-m", "graben.bench._memory_job")
COPY = "plain copy_ of the same tensors, 2 ranks"
READER = "GrabenReader from the cluster, new processes"
PLAIN = "DDP loop without checkpoints, 2 ranks"
QUICK_STEPS = 20
"""Steps of each kind the loop times with ``--quick`` (three times as many without)."""
BATCH = 256
"""Samples per step of the loop's model: its step takes ~0.15 s here."""


@contextmanager
def memory_agent(ctx: Context) -> Iterator[str]:
    """A fixture: one memory agent for the run, with room for every job's steps; its address."""
    shm = Path(f"/dev/shm/graben-bench-{uuid.uuid4().hex[:8]}")
    if not Path("/dev/shm").is_dir():
        raise Skip("no /dev/shm on this machine")
    address = f"127.0.0.1:{free_port()}"
    limit = str(max(4 * ctx.size, 1 << 30))
    argv = [sys.executable, "-m", "graben.store.cli", "agent", "serve", "--dir", str(shm)]
    proc = subprocess.Popen(
        [*argv, "--memory-limit", limit, "--listen", address], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        said = proc.stdout.readline().strip()
        if said != f"listening on {address}":
            raise Skip(f"the memory agent did not start: {said!r}")
        yield address
    finally:
        proc.terminate()
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()
        shutil.rmtree(shm, ignore_errors=True)


def _job(
    ctx: Context, action: str, root: str, agent: str, steps: int = 0, batch: int = 0
) -> dict[str, float]:
    spec = {"action": action, "target": root, "bytes_per_rank": ctx.size // WORLD}
    spec.update(steps=steps, batch=batch)
    env = {"OMP_NUM_THREADS": "1", "GRABEN_AGENT": agent}
    return rank_job(JOB, spec, WORLD, env, f"memory tier {action}")


def _rm(url: str, path: str, agent: str) -> None:
    """Remove a job's checkpoints from the store and from the agent's memory."""
    with connect(url) as client:
        if client.exists(path):
            client.rm(path, recursive=True)
    memory = AgentClient(agent)
    try:
        memory.drop(f"{url}{path}")
    finally:
        memory.close()


@workload("ckpt-memory", "Memory tier: a save's blocking time; a restarted job's load")
def ckpt_memory(ctx: Context) -> list[Result]:
    """The time a save into the memory tier blocks (its segment's pages reused, as in a
    job's steady state) beside a ``copy_`` of the same tensors into warm buffers; then new
    processes (the savers gone) load the newest step from memory, and the store's newest
    with ``GrabenReader`` from the cluster: the same bytes, checked."""
    url, agent = ctx.fixture(local_cluster), ctx.fixture(memory_agent)
    root = f"{url}/bench-memory-{ctx.trial}"
    with ctx.step("saves into the memory tier, then a restarted job's loads", 3) as tick:
        saved = _job(ctx, "save", root, agent)
        tick(1)
        loaded = _job(ctx, "load", root, agent)
        tick(2)
    _rm(url, f"/bench-memory-{ctx.trial}", agent)
    per_gib, name = ctx.size / WORLD / 2**30, "ckpt-memory"
    blocked = "save into the memory tier, 2 ranks: blocked"
    memory = "load_latest from the memory tier, new processes"
    return [
        Result(name, COPY, saved["copy"] * 1e3 / per_gib, "ms/GiB/rank", COPY),
        Result(name, blocked, saved["blocked"] * 1e3 / per_gib, "ms/GiB/rank", COPY),
        Result(name, READER, gbps(ctx.size, loaded["store"]), "GB/s", READER),
        Result(name, memory, gbps(ctx.size, loaded["memory"]), "GB/s", READER),
    ]


@workload("ckpt-memory-loop", "Memory tier: ms per DDP step, saving every step, beside none")
def ckpt_memory_loop(ctx: Context) -> list[Result]:
    """A 4.2M-parameter MLP (16.8 MB of weights) under DDP, batch 256: the step time
    without checkpoints, then with a save into the memory tier after every step (the
    store gets one of every ``steps``, in the background)."""
    url, agent = ctx.fixture(local_cluster), ctx.fixture(memory_agent)
    root = f"/bench-memory-loop-{ctx.trial}"
    steps = QUICK_STEPS if ctx.quick else 3 * QUICK_STEPS
    with ctx.step(f"{steps} steps without, {steps} with", 2 * steps) as tick:
        report = _job(ctx, "loop", f"{url}{root}", agent, steps=steps, batch=BATCH)
        tick(2 * steps)
    _rm(url, root, agent)
    name, unit = "ckpt-memory-loop", "ms/step"
    copy = "DDP loop with a plain copy_ of its weights every step (the floor)"
    saving = "DDP loop saving every step into the memory tier"
    return [
        Result(name, PLAIN, report["plain"] * 1e3, unit, PLAIN),
        Result(name, copy, report["copy"] * 1e3, unit, PLAIN),
        Result(name, saving, report["saving"] * 1e3, unit, PLAIN),
    ]


MEMORY_RANKS = {True: (256, 4 << 20), False: (1024, 1 << 20)}
"""Ranks and bytes each saves, ``--quick`` or not: 1 GiB a step either way (each step's
segments and their peers' copies, two steps kept, fit this machine's memory)."""


@workload("ckpt-memory-ranks", "Memory tier, 1,024 ranks over 8 agents: blocked, held (ms)")
def ckpt_memory_ranks(ctx: Context) -> list[Result]:
    """Many ranks (``--quick``: 256 of 4 MiB, else 1,024 of 1 MiB) in 4 processes save
    into the memory tier of 8 agents standing for hosts, peers paired, every step
    (``_memory_ranks``): each rank's blocked time beside its own ``copy_`` of the same
    tensors, the time until every rank holds the step, and the agents' cost."""
    from .._memory_ranks import save_steps

    world, size = MEMORY_RANKS[ctx.quick]
    secret = make_secret_file(ctx.scratch / "agents-secret")
    with ctx.step(f"{world} ranks save into 8 agents every step", 1) as tick:
        with environ({"GRABEN_SECRET_FILE": str(secret)}):
            out = save_steps(world, size)
        tick(1)
    name, ms, ranks = "ckpt-memory-ranks", "ms", f"{world} ranks"
    copy_p99 = f"plain copy_ of the same tensors, {ranks}: p99"
    copy_median = f"plain copy_ of the same tensors, {ranks}: median"
    rows = [
        (copy_p99, out.copy_p99 * 1e3, ms, copy_p99),
        (copy_median, out.copy_median * 1e3, ms, copy_median),
        (f"save into the memory tier, {ranks}: blocked, p99", out.blocked_p99 * 1e3, ms, copy_p99),
        (
            f"save into the memory tier, {ranks}: blocked, median",
            out.blocked_median * 1e3,
            ms,
            copy_median,
        ),
        (f"{ranks}: saves blocked over 2x the rank's copy_ + 20 ms", out.over_bound, "saves", ""),
        (f"{ranks}: first rank's save to the step held by all", out.first_to_held * 1e3, ms, ""),
        (f"{ranks}: last rank's save to the step held by all", out.last_to_held * 1e3, ms, ""),
        (f"{ranks}: CPU per rank and save", out.rank_cpu_per_save * 1e3, ms, ""),
        ("8 agents together: CPU per step", out.agents_cpu_per_step * 1e3, ms, ""),
        ("an agent's resident memory, most", out.agent_rss_max / 2**20, "MiB", ""),
    ]
    return [Result(name, row, float(v), unit, base or row) for row, v, unit, base in rows]
