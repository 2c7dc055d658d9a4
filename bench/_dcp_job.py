"""One rank of the bench's DCP jobs: ``python -m graben.bench._dcp_job SPEC RANK WORLD PORT``.

``SPEC`` is JSON: ``system`` (which writer and reader), ``action`` (``save``,
``load``, ``incremental`` or ``async``), ``target`` (path or URL),
``bytes_per_rank``, ``storage_options`` (for fsspec) and ``env`` (which
the parent sets when it starts the rank: S3's endpoint, region and keys for
s3torchconnector). Every
rank times its part between two barriers; rank 0 prints one JSON line.
Not imported by anything: it runs as a separate process per rank.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.state_dict_loader import load
from torch.distributed.checkpoint.state_dict_saver import save

TENSOR_BYTES = 16 * 1024 * 1024
SETTLE_S = 3.0


def state_dict(rank: int, nbytes: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Incompressible, distinct tensors (no two chunks equal); the same for (rank, seed)."""
    gen = torch.Generator().manual_seed(1000 * seed + rank)
    count = max(1, nbytes // TENSOR_BYTES)
    each = nbytes // count // 4
    return {
        f"rank{rank}.t{i}": torch.randint(0, 2**31 - 1, (each,), dtype=torch.int32, generator=gen)
        for i in range(count)
    }


def writer(spec: dict[str, Any], target: str) -> Any:
    system = spec["system"]
    if system == "fs":
        return FileSystemWriter(target)
    if system.startswith("fsspec"):
        return FsspecWriter(target, **spec.get("storage_options", {}))
    if system == "s3torch":
        from s3torchconnector.dcp import S3StorageWriter

        region, config = _s3torch()  # one writer thread: its default, kept
        return S3StorageWriter(region, target, s3client_config=config)
    from graben.checkpoint import GrabenWriter

    # one per process, reset to each save, as a job keeps it: it holds the last save's metadata
    made = _writers.get("graben")
    if made is None:
        replication = spec.get("storage_options", {}).get("replication")
        made = _writers["graben"] = GrabenWriter(target, replication=replication)
    else:
        made.reset(target)
    return made


_planners: dict[str, Any] = {}
_writers: dict[str, Any] = {}


def planner(spec: dict[str, Any]) -> Any:
    """GrabenWriter's planner, one per process as a job keeps it; DCP's default for the rest."""
    if spec["system"] != "graben":
        return None
    from graben.checkpoint import GrabenSavePlanner

    return _planners.setdefault("graben", GrabenSavePlanner())


def load_planner(spec: dict[str, Any]) -> Any:
    """GrabenReader's planner; DCP's default for the rest."""
    if spec["system"] != "graben":
        return None
    from graben.checkpoint import GrabenLoadPlanner

    return GrabenLoadPlanner()


def reader(spec: dict[str, Any], target: str) -> Any:
    system = spec["system"]
    if system == "fs":
        return FileSystemReader(target)
    if system.startswith("fsspec"):
        return FsspecReader(target, **spec.get("storage_options", {}))
    if system == "s3torch":
        from s3torchconnector.dcp import S3StorageReader

        region, config = _s3torch()
        return S3StorageReader(region, target, s3client_config=config)
    from graben.checkpoint import GrabenReader

    return GrabenReader(target)


def _s3torch() -> tuple[str, Any]:
    """s3torchconnector's region and client config; the endpoint and keys are in the
    environment too (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...), where its client
    reads them."""
    from s3torchconnector import S3ClientConfig

    # An endpoint on 127.0.0.1 has no bucket.host names: address the bucket in the path.
    return os.environ["AWS_REGION"], S3ClientConfig(force_path_style=True)


def timed(fn: Any) -> float:
    dist.barrier()
    start = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - start


def run(spec: dict[str, Any], rank: int) -> dict[str, float]:
    nbytes, target, action = spec["bytes_per_rank"], spec["target"], spec["action"]
    seed = spec.get("seed", 0)
    if action == "save":
        _warm_up(spec, rank, target, seed)
        state = state_dict(rank, nbytes, seed)
        return {
            "seconds": timed(
                lambda: save(state, storage_writer=writer(spec, target), planner=planner(spec))
            )
        }
    if action == "load":
        want = state_dict(rank, nbytes, seed)
        state = {k: torch.empty_like(v) for k, v in want.items()}
        seconds = timed(
            lambda: load(state, storage_reader=reader(spec, target), planner=load_planner(spec))
        )
        if any(not torch.equal(state[k], want[k]) for k in want):
            raise SystemExit(f"rank {rank}: loaded values differ")
        return {"seconds": seconds}
    if action == "incremental":
        _warm_up(spec, rank, target, seed)
        state = state_dict(rank, nbytes, seed)
        full = timed(
            lambda: save(
                state, storage_writer=writer(spec, f"{target}/full"), planner=planner(spec)
            )
        )
        for key in list(state)[: max(1, len(state) // 10)]:  # 10% of the tensors change
            state[key].add_(1)
        os.sync()  # the disk settles between the two, as between the bench's jobs
        time.sleep(SETTLE_S)
        incremental = timed(
            lambda: save(
                state, storage_writer=writer(spec, f"{target}/incr"), planner=planner(spec)
            )
        )
        return {"full": full, "incremental": incremental}
    return _async(spec, rank)


def _warm_up(spec: dict[str, Any], rank: int, target: str, seed: int) -> None:
    """A training job saves many times from one process: the first save's set-up
    (connections, threads, buffers) is paid once, untimed, here."""
    warm = state_dict(rank, TENSOR_BYTES, seed + 500)
    save(warm, storage_writer=writer(spec, f"{target}-warmup"), planner=planner(spec))


def _async(spec: dict[str, Any], rank: int) -> dict[str, float]:
    """Blocking time of the second async save (the first allocates the staging buffers)."""
    from graben.checkpoint import CheckpointManager

    state = state_dict(rank, spec["bytes_per_rank"])
    replication = spec.get("storage_options", {}).get("replication")
    with CheckpointManager(spec["target"], keep_last=2, replication=replication) as manager:
        for step in (1, 2):  # the first saves allocate and fault in the staging buffers
            manager.save(step, state, async_=True)
            manager.wait()
            state[next(iter(state))].add_(1)
        dist.barrier()
        start = time.perf_counter()
        pending = manager.save(3, state, async_=True)
        blocked = time.perf_counter() - start
        pending.result()  # type: ignore[union-attr]
    return {"blocked": blocked, "copy": _plain_copy(state)}


def _plain_copy(state: dict[str, torch.Tensor]) -> float:
    """The floor under staging: ``copy_`` of the same tensors into buffers copied into before."""
    buffers = {key: torch.empty_like(value) for key, value in state.items()}
    for key, value in state.items():
        buffers[key].copy_(value)
    dist.barrier()
    start = time.perf_counter()
    for key, value in state.items():
        buffers[key].copy_(value)
    return time.perf_counter() - start


def main(run: Callable[[dict[str, Any], int], dict[str, float]] = run) -> None:
    """Join the job (``SPEC RANK WORLD PORT`` from the command line), ``run`` this rank's
    part; rank 0 prints every figure, the slowest rank's (the job's)."""
    spec = json.loads(sys.argv[1])
    rank, world, port = (int(a) for a in sys.argv[2:5])
    warnings.filterwarnings("ignore")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        result = run(spec, rank)
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, result)
        if rank == 0:
            keys = gathered[0].keys()
            print(json.dumps({k: max(g[k] for g in gathered) for k in keys}))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
