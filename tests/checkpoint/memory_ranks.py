"""One rank of a DDP loop checkpointing every step into the memory tier.

``python memory_ranks.py ACTION URL RANK WORLD PORT STEPS STORE_EVERY DIE_AT WIDTH``
with ``$GRABEN_AGENT`` naming the rank's agent. ``train`` resumes from the
latest step (if any), then trains ``STEPS`` steps, saving each with
``tiers=("memory", "store")`` and printing ``{"saved": step, "digest": ...}``;
at step ``DIE_AT`` it SIGKILLs itself right after the save returns. ``torn``
is ``train`` in which rank 1 SIGKILLs itself *before* saving step ``DIE_AT``,
while the others save it. ``resume`` loads the latest step into a fresh model
and prints ``{"step": ..., "digest": ...}``.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from graben.checkpoint import CheckpointManager


def model(width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, 1))


def digest(module: nn.Module) -> str:
    h = hashlib.sha256()
    for tensor in module.state_dict().values():
        h.update(tensor.numpy().tobytes())
    return h.hexdigest()[:16]


def say(**what: object) -> None:
    print(json.dumps(what), flush=True)


def train(
    manager: CheckpointManager, rank: int, steps: int, die_at: int, width: int, torn: bool
) -> None:
    ddp = DistributedDataParallel(model(width))
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    state = {"model": ddp.module.state_dict(), "step": 0}
    start = manager.load_latest(state) or 0
    ddp.module.load_state_dict(state["model"])
    data = torch.Generator().manual_seed(rank + 1000 * start)
    for step in range(start + 1, start + 1 + steps):
        x, y = torch.randn(16, 32, generator=data), torch.randn(16, 1, generator=data)
        optimizer.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
        if torn and step == die_at and rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        manager.save(step, {"model": ddp.module.state_dict(), "step": step}, async_=True)
        say(saved=step, digest=digest(ddp.module))
        if step == die_at:
            os.kill(os.getpid(), signal.SIGKILL)
    manager.wait()


def resume(manager: CheckpointManager, width: int) -> None:
    fresh = model(width)
    state = {"model": fresh.state_dict(), "step": -1}
    step = manager.load_latest(state)
    fresh.load_state_dict(state["model"])
    say(step=step, saved_step=state["step"], digest=digest(fresh))


def main(argv: list[str]) -> None:
    action, url, rank, world, port, steps, every, die_at, width = argv
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=int(rank), world_size=int(world)
    )
    manager = CheckpointManager(url, tiers=("memory", "store"), store_every=int(every))
    try:
        if action == "resume":
            resume(manager, int(width))
        else:
            train(manager, int(rank), int(steps), int(die_at), int(width), action == "torn")
        manager.close()
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
