"""One rank of a gloo job saving or loading a DTensor-sharded model + optimizer state.

``python ckpt_ranks.py save|steps|load|die URL RANK WORLD PORT``. The full
tensors are the same on every run (seeded), so a job of any world size can
check every value it loads. ``steps`` saves twice with one
``GrabenSavePlanner`` (zeros to ``URL-first``, then the values to ``URL``)
and prints ``reused=`` for the second. ``load`` uses ``GrabenLoadPlanner``
and prints the rank files whose metadata it read as JSON. ``die`` saves
like ``save`` but rank 1 is killed (``os._exit``) halfway through writing
its file; ``die-staged`` kills rank 1 once its files are stored, before the
coordinator has them; ``die-before-commit`` and ``die-after-commit`` kill the
coordinator (rank 0) just before and just after its publishing commit.
"""

from __future__ import annotations

import gc
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor, init_device_mesh

from graben.checkpoint import GrabenLoadPlanner, GrabenReader, GrabenSavePlanner, GrabenWriter

SHAPES = {"embed": (96, 40), "proj": (40, 64), "norm": (64,)}


def full_values() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(2026)
    return {name: torch.randn(*shape, generator=gen) for name, shape in SHAPES.items()}


def state(mesh: object, fill: bool) -> dict[str, object]:
    """Model weights sharded on dim 0, proj's optimizer state sharded on dim 1."""
    values = full_values()

    def shard(name: str, dim: int, scale: float = 1.0) -> DTensor:
        full = values[name] * scale if fill else torch.zeros(SHAPES[name])
        return distribute_tensor(full, mesh, [Shard(dim)])  # type: ignore[arg-type]

    return {
        "model": {name: shard(name, 0) for name in SHAPES},
        "optim": {
            "state": {"proj": {"exp_avg": shard("proj", 1, 0.5), "step": 11 if fill else 0}},
            "lr": 0.001 if fill else 0.0,
        },
    }


def check(loaded: dict[str, object]) -> None:
    values = full_values()
    model = loaded["model"]
    assert isinstance(model, dict)
    for name in SHAPES:
        got = model[name].full_tensor()
        if not torch.equal(got, values[name]):
            raise SystemExit(f"model.{name} differs after load")
    optim = loaded["optim"]
    assert isinstance(optim, dict)
    if not torch.equal(optim["state"]["proj"]["exp_avg"].full_tensor(), values["proj"] * 0.5):
        raise SystemExit("optim exp_avg differs after load")
    if optim["state"]["proj"]["step"] != 11 or optim["lr"] != 0.001:
        raise SystemExit(f"optimizer scalars differ: {optim}")


def main() -> None:
    action, url = sys.argv[1], sys.argv[2]
    rank, world, port = (int(a) for a in sys.argv[3:6])
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    mesh = init_device_mesh("cpu", (world,))
    try:
        _act(action, url, mesh, rank)
        dist.barrier()
    finally:
        # The mesh's groups and the tensors on it go before the default group, in
        # torch's own release (the order ddp_ranks.py needed). CI saw a loading rank
        # die of "terminate called" at exit, after its correct output; this order is
        # the likely cure, not a confirmed one (1 run in many).
        del mesh
        gc.collect()
        dist.destroy_process_group()


def _act(action: str, url: str, mesh: DeviceMesh, rank: int) -> None:
    if action == "load":
        loaded = state(mesh, fill=False)
        reader = GrabenReader(url)
        dcp.load(loaded, storage_reader=reader, planner=GrabenLoadPlanner())
        check(loaded)
        assert reader.ranked is not None, "a graben checkpoint is read by rank"
        read = {"files": reader.ranked.rank_files_read, "full": reader.ranked.read_full}
        print(json.dumps(read))
    elif action == "steps":
        planner = GrabenSavePlanner()
        dcp.save(
            state(mesh, fill=False),
            storage_writer=GrabenWriter(f"{url}-first"),
            planner=planner,
        )
        dcp.save(state(mesh, fill=True), storage_writer=GrabenWriter(url), planner=planner)
        print(f"reused={planner.reused}")
    else:
        writer = GrabenWriter(url)
        if action == "die" and rank == 1:
            _die_halfway(writer)
        elif action in DYING and rank == DYING[action]:
            _die_at(writer, action)
        dcp.save(state(mesh, fill=True), storage_writer=writer)


DYING = {"die-staged": 1, "die-before-commit": 0, "die-after-commit": 0}
"""Each way to die and the rank that dies."""


def _die_at(writer: GrabenWriter, action: str) -> None:
    """The rank is killed at the step ``action`` names."""
    aio = writer.client.aio
    finish, publish = aio.finish_uploads, aio.publish

    async def staged(*args: object, **kwargs: object) -> object:
        await finish(*args, **kwargs)  # type: ignore[arg-type]
        os._exit(9)

    async def published(*args: object, **kwargs: object) -> object:
        if action == "die-after-commit":
            await publish(*args, **kwargs)  # type: ignore[arg-type]
        os._exit(9)

    if action == "die-staged":
        aio.finish_uploads = staged  # type: ignore[method-assign,assignment]
    else:
        aio.publish = published  # type: ignore[method-assign,assignment]


def _die_halfway(writer: GrabenWriter) -> None:
    """Rank 1 stores part of its file's chunks, then is killed."""
    aio = writer.client.aio
    stage = aio.stage_parts

    async def dying(path: str, parts: list[object], **kwargs: object) -> object:
        upload, _ = await stage(path + ".part", parts[:2])  # type: ignore[arg-type]
        await upload.commit()
        os._exit(9)

    aio.stage_parts = dying  # type: ignore[method-assign,assignment]


if __name__ == "__main__":
    main()
