"""One rank of a DDP loop with AdamW, resumed from its checkpoints, as users write one.

``python resume_ranks.py ACTION URL RANK WORLD PORT``. ``train`` resumes from
the latest step under URL (if any) and trains to step ``STEPS - 1``, saving
``{"model": ddp, "optim": adamw, "sched": scheduler, "data": batches}`` after
every step (``async_=True``) and printing ``{"step": s, "loss": ...}`` (the
loss over every rank's rows); ``train-die-K`` SIGKILLs itself right after
step K's save returns. ``old`` resumes the old way, from plain state dicts
taken before the first step, and prints the error it gets.

Each step's batch is ``ROWS`` rows cut evenly among the ranks, drawn from a
generator the ``Batches`` Stateful keeps: a run on 2 ranks and one on 1 see
the same data, and a resume that lost the data's place would not.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from graben.checkpoint import CheckpointManager
from graben.store import InvalidArgument

STEPS = 12
ROWS = 32


class Batches:
    """Each step's rows of this rank; a ``Stateful``: its generator's state is saved."""

    def __init__(self, rank: int, world: int) -> None:
        self.rows = slice(rank * ROWS // world, (rank + 1) * ROWS // world)
        self.generator = torch.Generator().manual_seed(1234)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(ROWS, 16, generator=self.generator)
        y = torch.randn(ROWS, 1, generator=self.generator)
        return x[self.rows], y[self.rows]

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))


def train(url: str, rank: int, world: int, die_at: int) -> None:
    ddp = DistributedDataParallel(model())
    optim = torch.optim.AdamW(ddp.parameters(), lr=0.02, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.StepLR(optim, step_size=4, gamma=0.5)
    batches = Batches(rank, world)
    state = {"model": ddp, "optim": optim, "sched": sched, "data": batches}
    with CheckpointManager(url, keep_last=2) as ckpt:
        resumed = ckpt.load_latest(state)
        print(json.dumps({"resumed": resumed}), flush=True)
        for step in range(0 if resumed is None else resumed + 1, STEPS):
            x, y = batches.next()
            loss = nn.functional.mse_loss(ddp(x), y)
            optim.zero_grad()
            loss.backward()  # DDP averages the gradients of every rank's rows
            optim.step()
            sched.step()
            ckpt.save(step, state, async_=True)
            print(json.dumps({"step": step, "loss": _everyone(loss, world)}), flush=True)
            if step == die_at:
                os.kill(os.getpid(), signal.SIGKILL)
    del ddp, state  # before the group goes: see ddp_ranks.py
    gc.collect()


def old(url: str) -> None:
    """The pattern most scripts had: state dicts taken before the first step."""
    net = model()
    optim = torch.optim.AdamW(net.parameters(), lr=0.02)
    state = {"model": net.state_dict(), "optim": optim.state_dict()}
    with CheckpointManager(url) as ckpt:
        try:
            resumed = ckpt.load_latest(state)
        except InvalidArgument as exc:
            print(json.dumps({"refused": str(exc)}), flush=True)
        else:
            print(json.dumps({"resumed": resumed}), flush=True)


def _everyone(loss: torch.Tensor, world: int) -> float:
    """The loss over every rank's rows (each rank holds as many)."""
    total = loss.detach().clone()
    dist.all_reduce(total)
    return float(total / world)


def main(action: str, url: str, rank: int, world: int, port: int) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        if action == "old":
            old(url)
        else:
            die_at = action.removeprefix("train").removeprefix("-die-")
            train(url, rank, world, int(die_at or -1))
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    _, action, url, rank, world, port = sys.argv
    main(action, url, int(rank), int(world), int(port))
