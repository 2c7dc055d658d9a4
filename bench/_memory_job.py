"""One rank of the bench's memory-tier jobs.

``python -m graben.bench._memory_job SPEC RANK WORLD PORT``:

``SPEC`` is JSON: ``action``, ``target`` (the manager's root URL),
``bytes_per_rank``, ``steps`` and ``batch`` (the loop's); ``$GRABEN_AGENT`` names the node's agent.

- ``save``: five warm-up saves (every other one goes on to the store, so
  pages are reused as a job's are), then the time one memory-only save
  blocks, and a plain ``copy_`` of the same tensors into buffers copied into before;
- ``load``: new processes: the time ``load_latest`` takes from memory (the
  newest step is there only), then ``load`` of the store's newest step
  (``GrabenReader`` from the cluster), each into tensors already written
  once (as a model's initialisation writes its parameters: this VM takes
  ~0.6 ms to fault in each MiB of fresh memory, more than either read
  costs) and with the store's connections open, each checked;
- ``loop``: a small model's DDP step, timed over ``steps`` steps each without
  checkpoints, with a plain ``copy_`` of its weights (the floor under any
  save) and with a save into the memory tier, after every step, in rounds of
  ``ROUND`` taking turns; the median of each.

Rank 0 prints one JSON line (each figure the slowest rank's).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from graben.bench._dcp_job import _plain_copy, main, state_dict
from graben.checkpoint import CheckpointManager

WARM_SAVES = 5
ROUND = 5
"""Steps in a row of one kind in the loop, before the next kind's turn."""
WIDTH = 1024


def _manager(spec: dict[str, Any], store_every: int) -> CheckpointManager:
    return CheckpointManager(
        spec["target"],
        tiers=("memory", "store"),
        store_every=store_every,
        replication=1,
        keep_last=2,
    )


def save(spec: dict[str, Any], rank: int) -> dict[str, float]:
    state = state_dict(rank, spec["bytes_per_rank"])
    with _manager(spec, store_every=2) as manager:
        for step in range(1, WARM_SAVES + 1):
            manager.save(step, state, async_=True)
            manager.wait()
            state[next(iter(state))].add_(1)
        dist.barrier()
        start = time.perf_counter()
        manager.save(WARM_SAVES + 1, state, async_=True)  # in memory only
        blocked = time.perf_counter() - start
    return {"blocked": blocked, "copy": _plain_copy(state)}


def load(spec: dict[str, Any], rank: int) -> dict[str, float]:
    want = state_dict(rank, spec["bytes_per_rank"])
    with _manager(spec, store_every=2) as manager:
        state = {k: torch.zeros_like(v) for k, v in want.items()}  # as a model's init writes
        manager.latest()  # the store's connections open, for both loads alike
        dist.barrier()
        start = time.perf_counter()
        step = manager.load_latest(state)
        memory = time.perf_counter() - start
        if step != WARM_SAVES + 1:
            raise SystemExit(f"rank {rank}: loaded step {step}, not {WARM_SAVES + 1} from memory")
        _check(state, want, rank, added=WARM_SAVES)
        state = {k: torch.zeros_like(v) for k, v in want.items()}
        dist.barrier()
        start = time.perf_counter()
        manager.load(WARM_SAVES, state)
        store = time.perf_counter() - start
        _check(state, want, rank, added=WARM_SAVES - 1)
    return {"memory": memory, "store": store}


def _check(
    state: dict[str, torch.Tensor], want: dict[str, torch.Tensor], rank: int, added: int
) -> None:
    first = next(iter(want))
    expected = {**want, first: want[first] + added}
    if any(not torch.equal(state[k], expected[k]) for k in want):
        raise SystemExit(f"rank {rank}: loaded values differ")


def loop(spec: dict[str, Any], rank: int) -> dict[str, float]:
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(WIDTH, WIDTH) for _ in range(4)))
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    data = torch.randn(spec["batch"], WIDTH, generator=torch.Generator().manual_seed(rank))

    def step() -> None:
        optimizer.zero_grad()
        ddp(data).square().mean().backward()
        optimizer.step()

    buffers = {k: torch.empty_like(v) for k, v in model.state_dict().items()}

    def copy() -> None:
        for key, value in model.state_dict().items():
            buffers[key].copy_(value)

    with _manager(spec, store_every=spec["steps"]) as manager:
        saves = 0

        def save() -> None:
            nonlocal saves
            manager.save(saves, {"model": model.state_dict()}, async_=True)
            saves += 1

        modes = {"plain": lambda: None, "copy": copy, "saving": save}
        for _ in range(3):  # warm-up: DDP's buckets, the first segments, the copy's buffers
            step()
            copy()
            save()
        times: dict[str, list[float]] = {mode: [] for mode in modes}
        for i in range(len(modes) * spec["steps"]):
            mode = list(modes)[(i // ROUND) % len(modes)]  # rounds of each, in turn
            dist.barrier()
            start = time.perf_counter()
            step()
            modes[mode]()
            times[mode].append(time.perf_counter() - start)
    return {mode: statistics.median(seconds) for mode, seconds in times.items()}


def run(spec: dict[str, Any], rank: int) -> dict[str, float]:
    action: dict[str, float] = {"save": save, "load": load, "loop": loop}[spec["action"]](
        spec, rank
    )
    return action


if __name__ == "__main__":
    main(run)
