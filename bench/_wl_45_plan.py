"""Checkpoint planning at scale: 4096 simulated ranks x 300 tensors in one process.

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

import statistics

from torch.distributed.checkpoint.filesystem import FileSystemReader

from graben.checkpoint import GrabenReader
from graben.store import connect

from ._context import Context
from ._plan_sim import Kind, graben_kind, quiet_gc, simulate_load, simulate_saves, stock_kind
from ._registry import Result, workload

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
    with ctx.step(f"{world} simulated ranks: {kind.name}, 2 saves", 2) as tick:
        times = []
        for save in simulate_saves(kind, world, TENSORS, 2):
            times.append(save.total)
            tick(1)
    return times[0], times[1]


@workload("ckpt-plan", "DCP planning + commit, 4096 simulated ranks x 300 tensors (s)")
def ckpt_plan(ctx: Context) -> list[Result]:
    """Both planners twice on the same layout; then a load plan on three ranks each."""
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
