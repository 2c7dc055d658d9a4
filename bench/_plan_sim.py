"""DCP's planning and metadata path for thousands of ranks, simulated in one process.

Every simulated rank runs the real planner and storage-writer calls that
``dcp.save`` makes, in DCP's order; only the collectives are replaced by
what they cost at the coordinator (unpickling what it gathers, pickling
what it scatters) and tensor data by nothing (records of a fixed size).
Each rank holds a row block of ``tensors`` parameters, as FSDP shards them.

What a rank does runs on every rank at once in a real job, so the report
counts its mean; what the coordinator does is counted whole. The sum is
the time a save spends planning and committing, data aside.
"""

from __future__ import annotations

import gc
import pickle
import posixpath
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter, _StorageInfo
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    TensorProperties,
)
from torch.distributed.checkpoint.planner import (
    LoadPlan,
    SavePlan,
    SavePlanner,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult

from graben.checkpoint import GrabenLoadPlanner, GrabenReader, GrabenSavePlanner, GrabenWriter
from graben.checkpoint._ranked import rank_metadata, rank_metadata_name
from graben.store import AsyncClient, Client, FileCommit, WriteOptions

ROWS, COLS = 16, 8
"""Rows and columns of each rank's block of a parameter (the size does not matter here)."""
RECORD = 4096
"""Bytes a simulated record takes in its rank file."""


class Shard:
    """A rank's row block of one parameter: what DCP plans with, holding no data."""

    def __init__(self, rank: int, world: int, rows: int = ROWS) -> None:
        self.chunk = ChunkStorageMetadata(torch.Size([rank * rows, 0]), torch.Size([rows, COLS]))
        self.global_size = torch.Size([world * rows, COLS])

    def size(self) -> torch.Size:
        """The whole parameter's size (what DCP checks a load against)."""
        return self.global_size

    def __create_write_items__(self, fqn: str, obj: object) -> list[WriteItem]:
        data = TensorWriteData(self.chunk, TensorProperties(dtype=torch.float32), self.size())
        index = MetadataIndex(fqn, self.chunk.offsets)
        return [WriteItem(index=index, type=WriteItemType.SHARD, tensor_data=data)]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return [self.chunk]


def state_dict(rank: int, world: int, tensors: int, rows: int = ROWS) -> dict[str, Any]:
    """Rank ``rank``'s state dict: ``tensors`` parameters, ``rows`` of each per rank."""
    return {f"layers.{i}.weight": Shard(rank, world, rows) for i in range(tensors)}


@contextmanager
def quiet_gc() -> Iterator[None]:
    """No garbage collection inside: one process holding every rank's objects would
    spend its time collecting what no real rank holds."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def results_of(plan: SavePlan, file: str) -> list[WriteResult]:
    """What writing ``plan``'s items into ``file`` would report."""
    return [
        WriteResult(item.index, RECORD, _StorageInfo(file, i * RECORD, RECORD))
        for i, item in enumerate(plan.items)
    ]


class SimulatedGrabenWriter(GrabenWriter):
    """``GrabenWriter`` storing no tensor data: its metadata path is the real one."""

    def _write_rank(
        self, plan: SavePlan, planner: SavePlanner, target: Any
    ) -> tuple[list[WriteResult], bytes, list[FileCommit]]:
        results = results_of(plan, target.file)
        metadata = rank_metadata(plan.items, results)
        name = posixpath.join(target.staging, rank_metadata_name(target.rank))
        write = WriteOptions(replication=self.replication)

        async def stage(aio: AsyncClient) -> list[FileCommit]:
            upload, _ = await aio.stage_parts(name, [metadata], write=write)
            return await aio.finish_uploads([upload])

        return results, metadata, self.client.submit(stage).result()


class SimulatedFileSystemWriter(FileSystemWriter):
    """DCP's ``FileSystemWriter`` storing no tensor data: its ``finish`` is the real one."""

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Any:
        prefix = plan.storage_data.prefix
        done: torch.futures.Future[list[WriteResult]] = torch.futures.Future()
        done.set_result(results_of(plan, f"{prefix}0.distcp"))
        return done


@dataclass
class Times:
    """Where one simulated save's time went, in seconds."""

    rank_plan: list[float] = field(default_factory=list)
    """Each rank: set up, local plan, pickling it for the gather."""
    gather: float = 0.0
    """Coordinator: unpickling every rank's plan."""
    global_plan: float = 0.0
    """Coordinator: the global plan and the storage's part of it."""
    scatter: float = 0.0
    """Coordinator: pickling each rank's plan for the scatter."""
    rank_write: list[float] = field(default_factory=list)
    """Each rank: finishing its plan, writing (metadata only here), pickling its results."""
    results: float = 0.0
    """Coordinator: unpickling every rank's results."""
    commit: float = 0.0
    """Coordinator: ``finish`` (metadata written, checkpoint published)."""
    gathered_bytes: int = 0
    """Bytes of plans gathered at the coordinator."""

    @property
    def total(self) -> float:
        """The save's planning and commit time on its critical path."""
        ranks = statistics.fmean(self.rank_plan) + statistics.fmean(self.rank_write)
        coordinator = self.gather + self.global_plan + self.scatter + self.results + self.commit
        return ranks + coordinator


@dataclass(frozen=True)
class Kind:
    """One planner and writer pair to simulate."""

    name: str
    """What the report calls it."""
    planner: Callable[[int], SavePlanner]
    """A rank's planner (made once, kept across saves)."""
    checkpoint: Callable[[str], Any]
    """A save's checkpoint id, from its name."""
    writer: Callable[[Any], StorageWriter]
    """A rank's writer, made for the first save's checkpoint id and reset to each next
    one (as ``dcp.save(..., checkpoint_id=...)`` resets the writer it is given)."""


def graben_kind(client: Client, root: str) -> Kind:
    """``GrabenSavePlanner`` + ``GrabenWriter`` on ``client``'s store under ``root``."""
    return Kind(
        "GrabenSavePlanner + GrabenWriter",
        lambda rank: GrabenSavePlanner(),
        lambda name: f"graben://{root}/{name}",
        lambda checkpoint: SimulatedGrabenWriter(checkpoint, client=client),
    )


def stock_kind(root: Path, *, caching: bool = False) -> Kind:
    """DCP's ``DefaultSavePlanner`` + ``FileSystemWriter`` on the local disk under ``root``."""

    def planner(rank: int) -> SavePlanner:
        made = DefaultSavePlanner(enable_plan_caching=caching)
        made._cached_plans_key = f"simulated-rank-{rank}"  # its cache is per class, not per rank
        return made

    name = "DCP DefaultSavePlanner + FileSystemWriter" + (" (plan caching)" if caching else "")
    return Kind(name, planner, lambda ckpt: root / ckpt, SimulatedFileSystemWriter)


def simulate_saves(kind: Kind, world: int, tensors: int, saves: int) -> Iterator[Times]:
    """Save the same layout ``saves`` times with ``world`` simulated ranks; each save's times."""
    planners = [kind.planner(rank) for rank in range(world)]
    states = [state_dict(rank, world, tensors) for rank in range(world)]
    writers = [kind.writer(kind.checkpoint("step-0")) for _ in range(world)]
    for save in range(saves):
        for writer in writers:
            writer.reset(kind.checkpoint(f"step-{save}"))
        yield _one_save(planners, writers, states)


def _one_save(
    planners: list[SavePlanner], writers: list[StorageWriter], states: list[Any]
) -> Times:
    times = Times()
    sent = []
    for rank, (planner, writer) in enumerate(zip(planners, writers, strict=True)):
        start = time.perf_counter()
        planner.set_up_planner(states[rank], writer.storage_meta(), rank == 0)
        writer.set_up_storage_writer(rank == 0, rank=rank, use_collectives=True)
        plan = writer.prepare_local_plan(planner.create_local_plan())
        sent.append(pickle.dumps(plan))
        times.rank_plan.append(time.perf_counter() - start)
    times.gathered_bytes = sum(map(len, sent))
    plans, times.gather = _timed(lambda: [pickle.loads(blob) for blob in sent])
    (plans, metadata), times.global_plan = _timed(lambda: planners[0].create_global_plan(plans))
    plans, more = _timed(lambda: writers[0].prepare_global_plan(plans))
    times.global_plan += more
    scattered, times.scatter = _timed(lambda: [pickle.dumps(plan) for plan in plans])
    written = []
    for rank, (planner, writer) in enumerate(zip(planners, writers, strict=True)):
        start = time.perf_counter()
        final = planner.finish_plan(pickle.loads(scattered[rank]))
        written.append(pickle.dumps(writer.write_data(final, planner).value()))
        times.rank_write.append(time.perf_counter() - start)
    results, times.results = _timed(lambda: [pickle.loads(blob) for blob in written])
    _, times.commit = _timed(lambda: writers[0].finish(metadata, results))
    return times


def simulate_load(
    reader: GrabenReader | FileSystemReader, rank: int, world: int, tensors: int, rows: int = ROWS
) -> tuple[float, LoadPlan]:
    """One simulated rank's metadata read and local load plan: (seconds, its read plan)."""
    graben = isinstance(reader, GrabenReader)
    planner = GrabenLoadPlanner() if graben else DefaultLoadPlanner()
    start = time.perf_counter()
    metadata = reader.read_metadata()
    planner.set_up_planner({}, metadata, rank == 0)
    # set up after: DCP's set-up replaces objects it does not know (the shards) by None
    planner.state_dict = state_dict(rank, world, tensors, rows)
    reader.set_up_storage_reader(metadata, rank == 0)
    sent = planner.create_local_plan()
    pickle.dumps(sent)  # what the rank sends the coordinator
    seconds = time.perf_counter() - start
    return seconds, planner.finish_plan(sent)


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start
