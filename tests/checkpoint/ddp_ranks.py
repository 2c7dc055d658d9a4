"""One rank of a DDP training loop saving asynchronously every step, as users write one.

``python ddp_ranks.py train URL RANK WORLD PORT``: ``STEPS`` steps of a small
model under ``DistributedDataParallel`` (gloo), ``CheckpointManager(URL,
keep_last=2).save(step, state, async_=True)`` after each; then it loads the
latest step into a fresh model and prints JSON: the steps listed, the latest,
and whether the loaded weights are the trained ones.
"""

from __future__ import annotations

import gc
import json
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from graben.checkpoint import CheckpointManager

STEPS = 8


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))


def main(url: str, rank: int, world: int, port: int) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        ddp = DistributedDataParallel(model())
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
        manager = CheckpointManager(url, keep_last=2)
        data = torch.Generator().manual_seed(rank)
        for step in range(STEPS):
            x, y = torch.randn(16, 32, generator=data), torch.randn(16, 1, generator=data)
            loss = nn.functional.mse_loss(ddp(x), y)  # DDP all-reduces in backward
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            manager.save(step, {"model": ddp.module.state_dict()}, async_=True)
        manager.wait()
        dist.barrier()  # the coordinator has moved latest and applied retention
        fresh = model()
        state = {"model": fresh.state_dict()}
        latest = manager.load_latest(state)
        fresh.load_state_dict(state["model"])
        same = all(
            torch.equal(a, b)
            for a, b in zip(fresh.parameters(), ddp.module.parameters(), strict=True)
        )
        steps = [c.step for c in manager.list()]
        print(json.dumps({"steps": steps, "latest": latest, "same": same}))
        manager.close()
        # DDP's reducer holds the default group, and freed last (at main's return) it
        # runs the group's destructor holding the GIL, which joins a gloo thread that
        # waits for the GIL: a deadlock 1 run in ~50 (seen in CI, py-spy's stacks). Freed
        # here, the group is released by destroy_process_group, without the GIL.
        del ddp
        gc.collect()
        dist.barrier()  # torch's advice: every rank reaches the teardown before any leaves
        print("closed; past the last barrier", file=sys.stderr, flush=True)
    finally:
        dist.destroy_process_group()
        print("process group destroyed", file=sys.stderr, flush=True)


if __name__ == "__main__":
    _, url, rank, world, port = sys.argv[1:]
    main(url, int(rank), int(world), int(port))
