"""The dataset door: one epoch of a Parquet dataset, cold and warm, beside pyarrow.

The dataset: rows of an id and a 4 KiB binary column, ``ctx.size / 4``
bytes of them (a quarter of the sequential size: every row becomes a Python
dict), in shards of 2,000 rows, uncompressed. ``dataset-epoch`` counts samples
per second, and again in GB/s of the shards' bytes, for:

- pyarrow reading the same shards from local disk (``pq.read_table`` +
  ``to_pylist`` per shard, each sample taken in a Python loop: the same
  conversion and consumption as the reader's), the baseline;
- ``CachedDataset`` epoch 1 from a 3-node cluster and from moto's S3, each
  with an empty node cache (cold), and epoch 2 from the cluster (warm cache).

- Mosaic Streaming (``StreamingDataset``, shuffled, ``batch_size=256``) reading
  the same rows converted to its MDS format on local disk: it runs in its
  own virtual environment (``make peers``: it needs another torch) through
  ``_mosaic_job.py``; without that environment the row is left out.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Any

from .._context import Context
from .._registry import Result, workload
from .cluster import local_cluster
from .fsspec import moto_s3

ROW = 4096
SHARD = 2000
PYARROW = "pyarrow, local Parquet"
MOSAIC = "Mosaic Streaming, local MDS"
GBS = ", in bytes"
"""The same figures again in GB/s of the dataset's shards (their bytes over the epoch's time)."""
MOSAIC_PYTHON = Path(".venv-peers/bin/python")
"""The peer environment ``make peers`` creates (``$GRABEN_MOSAIC_PYTHON`` overrides)."""


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
    rows = max(SHARD, ctx.size // 4 // ROW)
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


@workload("dataset-epoch", "a Parquet dataset's epoch: CachedDataset cold/warm vs pyarrow local")
def dataset_epoch(ctx: Context) -> list[Result]:
    """Samples per second of each system."""
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
    mosaic = _mosaic_epoch(ctx, ds)
    if mosaic is not None:
        timings[MOSAIC] = mosaic
    results, in_bytes = [], []
    for system, (count, seconds) in timings.items():
        if count != ds.rows:
            raise RuntimeError(f"{system} read {count} samples, not {ds.rows}")
        results.append(Result("dataset-epoch", system, count / seconds, "samples/s", PYARROW))
        gbs = ds.size / seconds / 1e9
        in_bytes.append(Result("dataset-epoch", f"{system}{GBS}", gbs, "GB/s", f"{PYARROW}{GBS}"))
    return results + in_bytes


def _mosaic_epoch(ctx: Context, ds: Datasets) -> tuple[int, float] | None:
    python = Path(os.environ.get("GRABEN_MOSAIC_PYTHON", MOSAIC_PYTHON))
    if not python.exists():
        ctx.console.print(f"dataset-epoch: no Mosaic Streaming at {python} (make peers); left out")
        return None
    job = Path(__file__).parent.parent / "_mosaic_job.py"  # bench/, beside the other jobs
    with ctx.step(f"dataset-epoch: {MOSAIC}", 1):
        done = subprocess.run(
            [str(python), str(job), str(ds.local), str(ctx.scratch / "mds")],
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"the Mosaic Streaming job failed: {done.stderr[-2000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return int(report["samples"]), float(report["seconds"])
