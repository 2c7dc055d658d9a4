"""The memory tier at scale: hundreds to a thousand ranks saving into it every step,
over several agents standing for hosts.

``AGENTS`` agents run on loopback, each standing for a host: the ranks are cut into
that many contiguous blocks, a block's ranks save to its agent, and each agent's
peer is the next one (0 and 1, 2 and 3, ...), where its finished segments are
copied, as on a real job. The ranks are threads in a few worker processes (as in
``_ranks``), each with the memory tier a ``CheckpointManager`` gives it
(``MemoryTier``) and a state of its own. One step, every rank at once:

1. ``copy_`` of its state into a buffer copied into before: the floor under any save;
2. the save, as the manager makes it: ``stage`` (the copy into its segment, reserved
   ahead while the loop trained), the agreement that every rank staged (the
   manager's ``all_reduce``; here, the pipes between the processes), then ``done``;
   the time from the call to ``done``'s return is what the rank was blocked;
3. each rank then waits for its agent's answer to ``done``: the step is held there
   (the manager waits for it at the rank's next call to the agent instead).

Between two saves the coordinator waits ``STEP_S``, standing for the training step.

Timed: each rank's ``copy_`` and blocked time, the time from the first rank's save to
the step held for every rank, the CPU the ranks' processes spent per rank and save
(beyond their ``copy_``'s), and the agents' CPU and resident memory.

On this 2-core machine the ranks of every "host" share the same two cores, and the
ranks of one worker process the same GIL: each rank's own work (its Python) adds up
over all of them, where on real hosts it would run on each host's cores.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from graben.bench._kit import free_port
from graben.bench._ranks import Workers, tree_cpu
from graben.checkpoint._memory import MemoryTier

AGENTS = 8
"""Agents standing for hosts."""
WARM_STEPS = 3
"""Saves before the timed ones: segments reserved ahead, pages touched, as in a job."""
STEP_S = 1.0
"""The training step between two saves (the GPU's work, here a sleep): an agent's hashing
and peer copy of one step run in it, as they would on a host's spare cores."""


@dataclass(frozen=True)
class Spread:
    """Which agent each rank saves to, and what it saves."""

    agents: list[str]
    """The agents' ``HOST:PORT``, in host order."""
    job: str
    world: int
    bytes_per_rank: int

    def agent_of(self, rank: int) -> str:
        return self.agents[rank * len(self.agents) // self.world]


class _Tiers:
    """A worker process's ranks: a memory tier, a state and a ``copy_`` buffer each."""

    def __init__(self, spread: Spread, ranks: range) -> None:
        self.spread, self.ranks = spread, ranks
        elements = spread.bytes_per_rank // 4
        self.states = [{"weight": torch.full((elements,), float(r))} for r in ranks]
        self.buffers = [torch.empty(elements) for _ in ranks]
        for buffer, state in zip(self.buffers, self.states, strict=True):
            buffer.copy_(state["weight"])  # warm: a job's own buffers are
        self.tiers = [MemoryTier(spread.job, spread.agent_of(r), r, spread.world) for r in ranks]
        self.threads = ThreadPoolExecutor(len(ranks), thread_name_prefix="rank")
        self._began = [0.0] * len(ranks)

    def _each(self, fn: Any) -> list[Any]:
        return list(self.threads.map(fn, range(len(self.ranks))))

    def copy(self) -> list[float]:
        """Each rank's ``copy_`` of its state, all at once: seconds."""

        def copy(i: int) -> float:
            started = time.perf_counter()
            self.buffers[i].copy_(self.states[i]["weight"])
            return time.perf_counter() - started

        return self._each(copy)

    def stage(self, step: int) -> list[str | None]:
        """Each rank's save up to the agreement: why it was not held (``None``: held)."""

        def stage(i: int) -> str | None:
            self._began[i] = time.perf_counter()
            return self.tiers[i].stage(step, self.states[i], False)

        return self._each(stage)

    def done(self, step: int) -> list[tuple[float, float, float]]:
        """Each rank's save from the agreement on: (began, returned, held) on the
        machine's monotonic clock (``perf_counter``, the same in every process)."""

        def done(i: int) -> tuple[float, float, float]:
            tier = self.tiers[i]
            tier.done(step, 1, False)
            returned = time.perf_counter()
            tier.client.settle()  # the agent answered done: the step is held there
            return self._began[i], returned, time.perf_counter()

        return self._each(done)

    def close(self) -> None:
        self.threads.shutdown()
        for tier in self.tiers:
            tier.close()


@dataclass(frozen=True)
class MemoryOutcome:
    """What the ranks' timed steps measured (seconds unless named otherwise)."""

    ranks: int
    bytes_per_rank: int
    steps: int
    blocked_median: float
    blocked_p99: float
    copy_median: float
    copy_p99: float
    over_bound: int
    """Rank steps blocked longer than twice that rank's own ``copy_`` (its median) + 20 ms."""
    first_to_held: float
    """The median step's time from the first rank's save to the step held for every rank."""
    last_to_held: float
    """The median step's time from the last rank's save to the step held for every rank."""
    agents_cpu_per_step: float
    """CPU seconds (user + system) of every agent together, per timed step."""
    rank_cpu_per_save: float
    """CPU seconds the ranks' processes spent on a save, per rank."""
    agent_rss_max: int
    """The largest resident memory of an agent at the end, in bytes."""
    agent_shm_max: int
    """The most bytes of segments one agent held in shared memory at the end."""


def save_steps(
    world: int,
    bytes_per_rank: int,
    *,
    steps: int = 5,
    processes: int = 4,
    agents: int = AGENTS,
    step_s: float | None = None,
) -> MemoryOutcome:
    """``world`` ranks in ``processes`` processes save into the memory tier of ``agents``
    agents, ``WARM_STEPS`` then ``steps`` timed steps, ``step_s`` apart (default
    ``STEP_S``; see the module)."""
    step_s = STEP_S if step_s is None else step_s
    job = f"/bench-memory-ranks-{uuid.uuid4().hex[:8]}"
    with _agents(agents, 8 * world // agents * bytes_per_rank) as (addresses, pids, dirs):
        spread = Spread(addresses, job, world, bytes_per_rank)
        workers = Workers(partial(_Tiers, spread), world, processes)
        try:
            copies: list[list[float]] = []
            timings: list[list[tuple[float, float, float]]] = []
            cpu = ranks_cpu = 0.0
            for step in range(1, WARM_STEPS + steps + 1):
                time.sleep(step_s)
                copied = workers.tell("copy")
                if step == WARM_STEPS + 1:
                    cpu = sum(tree_cpu(pid) for pid in pids)  # each agent's, from here
                before = _cpu(workers)
                why = [w for w in workers.tell("stage", step) if w is not None]
                if why:
                    raise RuntimeError(f"{len(why)} ranks' saves were not held: {why[0]}")
                done = workers.tell("done", step)
                if step > WARM_STEPS:
                    ranks_cpu += _cpu(workers) - before
                    copies.append(copied)
                    timings.append(done)
            cpu = sum(tree_cpu(pid) for pid in pids) - cpu
            rss = max(_rss(pid) for pid in pids)
            shm = max(sum(f.stat().st_size for f in d.rglob("*") if f.is_file()) for d in dirs)
        finally:
            workers.close()
    return _outcome(world, bytes_per_rank, copies, timings, (cpu, ranks_cpu), rss, shm)


def _outcome(
    world: int,
    bytes_per_rank: int,
    copies: list[list[float]],
    timings: list[list[tuple[float, float, float]]],
    cpus: tuple[float, float],
    rss: int,
    shm: int,
) -> MemoryOutcome:
    own_copy = [statistics.median(step[r] for step in copies) for r in range(world)]
    blocked = [[returned - began for began, returned, _ in step] for step in timings]
    over = sum(b > 2 * own_copy[r] + 0.020 for step in blocked for r, b in enumerate(step))
    flat_blocked = sorted(b for step in blocked for b in step)
    flat_copy = sorted(c for step in copies for c in step)
    first = [max(h for *_, h in step) - min(b for b, *_ in step) for step in timings]
    last = [max(h for *_, h in step) - max(b for b, *_ in step) for step in timings]
    return MemoryOutcome(
        world,
        bytes_per_rank,
        len(timings),
        statistics.median(flat_blocked),
        _p99(flat_blocked),
        statistics.median(flat_copy),
        _p99(flat_copy),
        over,
        statistics.median(first),
        statistics.median(last),
        cpus[0] / len(timings),
        cpus[1] / len(timings) / world,
        rss,
        shm,
    )


def _cpu(workers: Workers) -> float:
    return sum(tree_cpu(proc.pid) for proc in workers.procs)


def _p99(ordered: list[float]) -> float:
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


@contextlib.contextmanager
def _agents(count: int, limit: int) -> Any:
    """``count`` agents on loopback, each the next one's peer in pairs; their addresses,
    pids and shared-memory directories. The cluster secret is ``$GRABEN_SECRET_FILE``."""
    if not Path("/dev/shm").is_dir():
        raise RuntimeError("no /dev/shm on this machine")
    tag = uuid.uuid4().hex[:8]
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(count)]
    dirs = [Path(f"/dev/shm/graben-bench-{tag}-{i}") for i in range(count)]
    procs: list[subprocess.Popen[str]] = []
    try:
        for i, (address, shm) in enumerate(zip(addresses, dirs, strict=True)):
            peer = addresses[i ^ 1] if (i ^ 1) < count else ""
            argv = [sys.executable, "-m", "graben.store.cli", "agent", "serve", "--dir", str(shm)]
            argv += ["--memory-limit", str(limit), "--listen", address, "--log-level", "warning"]
            proc = subprocess.Popen(
                [*argv, *(("--peer", peer) if peer else ())], stdout=subprocess.PIPE, text=True
            )
            procs.append(proc)
            assert proc.stdout is not None
            said = proc.stdout.readline().strip()
            if said != f"listening on {address}":
                raise RuntimeError(f"a memory agent did not start: {said!r}")
        yield addresses, [p.pid for p in procs], dirs
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        for shm in dirs:
            shutil.rmtree(shm, ignore_errors=True)


if __name__ == "__main__":  # by hand: python -m graben.bench._memory_ranks RANKS MIB
    world = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    mib = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    if "GRABEN_SECRET_FILE" not in os.environ:
        raise SystemExit("set GRABEN_SECRET_FILE (graben cluster up makes one)")
    print(save_steps(world, mib << 20))
