"""The dataset door: one epoch of a Parquet dataset, cold and warm, beside pyarrow and the peers.

The dataset: rows of an id and a 4 KiB binary column, ``ctx.size / 2``
bytes of them, in shards of 2,000 rows, uncompressed. ``dataset-epoch``
counts samples per second, and again in GB/s of the shards' bytes, for:

- pyarrow reading the same shards from local disk (``pq.read_table`` +
  ``to_pylist`` per shard, each sample taken in a Python loop: the same
  conversion and consumption as the reader's), the baseline;
- ``CachedDataset`` epoch 1 from a 3-node cluster and from moto's S3, each
  with an empty node cache (cold), and epoch 2 from the cluster (warm cache);
- s3torchconnector's ``S3IterableDataset`` listing the same shards on moto's
  S3, each read whole and converted by pyarrow as above (cold, beside
  ``CachedDataset``'s epoch from moto).

Then the loaders, in the loop's process (0 workers) and with 2 DataLoader
workers (this machine's cores), each reading shuffled in batches of 256 as
its documentation shows (``_dataset_job``): graben's ``CachedLoader`` over
the cluster, Mosaic Streaming (local MDS), LitData (local chunks) and
WebDataset (local tar shards). Each row is a warm epoch (the second, whole);
start-up (building the dataset and loader, to the first batch) is reported
apart in seconds, beside graben's. Mosaic Streaming and LitData need another
torch and run in the peers' virtual environment (``make peers``); without it
their rows are left out, saying so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Any

from .._context import Context
from .._dataset_job import loader_options, measure
from .._kit import environ
from .._registry import Result, workload
from .cluster import local_cluster
from .fsspec import aws_env, moto_s3

ROW = 4096
SHARD = 2000
PYARROW = "pyarrow, local Parquet"
S3TORCH = "s3torchconnector S3IterableDataset (cold) from moto S3"
GRABEN_LOADER = "graben CachedLoader, cluster"
PEERS = {
    "mosaic": "Mosaic Streaming, local MDS",
    "litdata": "LitData, local chunks",
    "webdataset": "WebDataset, local tar",
}
NEED_PEERS_VENV = {"mosaic", "litdata"}
"""The peers that need another torch (they run in ``make peers``'s environment)."""
WORKERS = (0, 2)
GBS = ", in bytes"
"""The same figures again in GB/s of the dataset's shards (their bytes over the epoch's time)."""
PEERS_PYTHON = Path(".venv-peers/bin/python")
"""The peer environment ``make peers`` creates (``$GRABEN_PEERS_PYTHON`` overrides)."""


@dataclass(frozen=True, slots=True)
class Datasets:
    """The same dataset in three places."""

    local: Path
    cluster: str
    s3: str
    s3_options: dict[str, Any]
    rows: int
    size: int


@contextmanager
def _datasets(ctx: Context) -> Iterator[Datasets]:
    """A fixture: the dataset written locally, to the cluster and to moto's S3."""
    import pyarrow as pa

    from graben.dataloader import write_dataset

    url, s3 = ctx.fixture(local_cluster), ctx.fixture(moto_s3)
    rows = max(SHARD, ctx.size // 2 // ROW)
    seed = os.urandom(ROW * 64)
    payload = [seed[(i % 64) * ROW : (i % 64 + 1) * ROW] + i.to_bytes(8) for i in range(rows)]
    table = pa.table({"id": list(range(rows)), "data": payload})
    local = ctx.shared / "dataset-local"
    options = {
        "key": s3.key,
        "secret": s3.secret,
        "client_kwargs": s3.client_kwargs,
        "skip_instance_cache": True,
    }
    places = [(str(local), None), (f"{url}/bench/dataset", None), ("s3://bench/dataset", options)]
    with ctx.step("writing the dataset (local, cluster, s3)", 3) as advance:
        for where, storage in places:
            manifest = write_dataset(
                where, table, rows_per_shard=SHARD, compression=None, storage_options=storage
            )
            advance(1)
    try:
        yield Datasets(local, places[1][0], places[2][0], options, rows, manifest.size)
    finally:
        shutil.rmtree(local, ignore_errors=True)


def _pyarrow_epoch(ds: Datasets) -> int:
    import pyarrow.parquet as pq

    count = 0
    for shard in sorted(ds.local.glob("*.parquet")):
        for _ in pq.read_table(shard).to_pylist():  # a consumer takes each sample, as below
            count += 1
    return count


def _cached_epoch(
    url: str, cache: Path, options: dict[str, Any] | None, epochs: int
) -> tuple[int, float]:
    from graben.dataloader import CachedDataset

    dataset = CachedDataset(url, cache_dir=cache, storage_options=options, seed=0)
    seconds, count = 0.0, 0
    for epoch in range(epochs):
        dataset.set_epoch(epoch)
        start = perf_counter()
        count = sum(1 for _ in dataset)
        seconds = perf_counter() - start  # the last epoch's
    return count, seconds


@workload("dataset-epoch", "a Parquet dataset's epoch: CachedDataset, S3, loaders vs pyarrow")
def dataset_epoch(ctx: Context) -> list[Result]:
    """Samples per second of each system; the loaders' start-up apart."""
    ds = ctx.fixture(_datasets)
    timings: dict[str, tuple[int, float]] = {}
    with ctx.step(f"dataset-epoch: {PYARROW}", 1):
        start = perf_counter()
        rows = _pyarrow_epoch(ds)
        timings[PYARROW] = (rows, perf_counter() - start)
    cases = [
        ("CachedDataset epoch 1 (cold) from the cluster", ds.cluster, None, 1),
        ("CachedDataset epoch 1 (cold) from moto S3", ds.s3, ds.s3_options, 1),
        ("CachedDataset epoch 2 (warm cache)", ds.cluster, None, 2),
    ]
    for system, url, options, epochs in cases:
        cache = ctx.scratch / f"cache-{len(timings)}"
        with ctx.step(f"dataset-epoch: {system}", 1):
            timings[system] = _cached_epoch(url, cache, options, epochs)
        shutil.rmtree(cache, ignore_errors=True)
    with ctx.step(f"dataset-epoch: {S3TORCH}", 1):
        timings[S3TORCH] = _s3torch_epoch(ds)
    results, in_bytes = [], []
    for system, (count, seconds) in timings.items():
        if count != ds.rows:
            raise RuntimeError(f"{system} read {count} samples, not {ds.rows}")
        results.append(Result("dataset-epoch", system, count / seconds, "samples/s", PYARROW))
        gbs = ds.size / seconds / 1e9
        in_bytes.append(Result("dataset-epoch", f"{system}{GBS}", gbs, "GB/s", f"{PYARROW}{GBS}"))
    return results + _loaders(ctx, ds) + in_bytes


def _s3torch_epoch(ds: Datasets) -> tuple[int, float]:
    """s3torchconnector's ``S3IterableDataset`` over the shards on moto (each read whole,
    then pyarrow as in the baseline). Its client reads moto's address and keys from the
    environment."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from s3torchconnector import S3ClientConfig, S3IterableDataset

    aws = aws_env(ds.s3_options)
    with environ(aws):
        start = perf_counter()
        dataset = S3IterableDataset.from_prefix(
            f"{ds.s3}/",
            region=aws["AWS_REGION"],
            s3client_config=S3ClientConfig(force_path_style=True),
        )
        count = 0
        for shard in dataset:
            if shard.key.endswith(".parquet"):
                for _ in pq.read_table(pa.BufferReader(shard.read())).to_pylist():
                    count += 1
        return count, perf_counter() - start


# -- the loaders -------------------------------------------------------------------------


def _loaders(ctx: Context, ds: Datasets) -> list[Result]:
    """Each loader's warm epoch (samples/s beside pyarrow) and start-up (s beside graben's)."""
    results = []
    for workers in WORKERS:
        how = "in the loop's process" if workers == 0 else f"{workers} DataLoader workers"
        reports = {GRABEN_LOADER: _graben_loader(ctx, ds, workers)}
        for key, name in PEERS.items():
            report = _peer(ctx, ds, key, name, workers)
            if report is not None:
                reports[name] = report
        own = f"{GRABEN_LOADER}, start-up, {how}"
        warm, startup = [], []
        for name, report in reports.items():
            if (report["samples"], report["ids"], report["bytes"]) != _expected(ds):
                raise RuntimeError(f"{name} did not read every row once: {report}")
            rate = report["samples"] / report["seconds"]
            warm.append(Result("dataset-epoch", f"{name}, warm, {how}", rate, "samples/s", PYARROW))
            system = f"{name}, start-up, {how}"
            startup.append(Result("dataset-epoch", system, report["startup"], "s", own))
        results += warm + startup
    return results


def _expected(ds: Datasets) -> tuple[int, int, int]:
    """What one epoch of every row adds up to: samples, the sum of ids, payload bytes."""
    return ds.rows, ds.rows * (ds.rows - 1) // 2, ds.rows * (ROW + 8)


def _graben_loader(ctx: Context, ds: Datasets, workers: int) -> dict[str, float]:
    from graben.dataloader import CachedDataset, CachedLoader

    cache = ctx.scratch / f"cache-loader-{workers}"

    def build() -> CachedLoader:
        dataset = CachedDataset(ds.cluster, cache_dir=cache, seed=0)
        return CachedLoader(dataset, **loader_options(workers))

    try:
        with ctx.step(f"dataset-epoch: {GRABEN_LOADER}, {workers} workers", 1):
            return measure(build, lambda loader, epoch: loader.cached.set_epoch(epoch))
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _peer(ctx: Context, ds: Datasets, key: str, name: str, workers: int) -> dict[str, float] | None:
    """A peer's two epochs, run by ``_dataset_job`` in the Python that has it; None (and
    why, printed) if it is not installed or fails."""
    python = Path(sys.executable)
    if key in NEED_PEERS_VENV:
        python = Path(os.environ.get("GRABEN_PEERS_PYTHON", PEERS_PYTHON))
        if not python.exists():
            ctx.console.print(f"dataset-epoch: no {name} at {python} (make peers); left out")
            return None
    job = Path(__file__).parent.parent / "_dataset_job.py"  # bench/, beside the other jobs
    work = ctx.fixture(_peer_work)
    with ctx.step(f"dataset-epoch: {name}, {workers} workers", 1):
        done = subprocess.run(
            [str(python), str(job), key, str(ds.local), str(work), str(workers)],
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
    if done.returncode != 0:  # a peer that cannot run here leaves its rows out, saying why
        ctx.console.print(f"dataset-epoch: {name} failed; left out:\n{done.stderr[-2000:]}")
        return None
    report: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    if workers == 0:
        ctx.console.print(
            f"dataset-epoch: {name}: converted in {report['convert']:.1f} s (untimed)"
        )
    return report


@contextmanager
def _peer_work(ctx: Context) -> Iterator[Path]:
    """A fixture: where the peers keep their converted copies for the run."""
    work = ctx.shared / "dataset-peers"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)
