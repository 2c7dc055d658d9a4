"""The dataset peers' side of ``dataset-epoch``: Mosaic Streaming, LitData, WebDataset.

Each peer reads the bench's rows in its own format, converted from the
bench's local Parquet shards (timed apart from the epochs), with its
documented reader for data on local disk, shuffled, in batches of
``BATCH``:

- Mosaic Streaming: ``MDSWriter`` shards of 64 MiB, ``StreamingDataset(local=...,
  batch_size=BATCH)`` under a ``torch`` ``DataLoader``;
- LitData: ``litdata.optimize`` into 64 MB chunks, ``StreamingDataset`` under its
  ``StreamingDataLoader``;
- WebDataset: one tar per Parquet shard (``TarWriter``), ``WebDataset(urls,
  shardshuffle=...).shuffle(1000)`` under its ``WebLoader``.

``measure`` times two epochs of a loader the same way for every system,
graben's ``CachedLoader`` included (the bench imports it): start-up is the
time from building the dataset and its loader to the first batch, the figure
is the second (warm) epoch whole. The loop does the same small work per
sample for all (counts it, adds its id and its payload's length), and the
sums prove each row came once.

Mosaic Streaming and LitData need a torch other than the project's, so this
file also runs as a script in the peers' virtual environment (``make peers``)
and imports nothing of graben there::

    python _dataset_job.py SYSTEM PARQUET_DIR WORK_DIR WORKERS

It prints one JSON line: ``measure``'s figures and ``convert`` (seconds).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

BATCH = 256
SHUFFLE_BUFFER = 1000
"""WebDataset's sample shuffle buffer, the size its documentation shows."""
CHUNK_BYTES = 64 << 20


def as_list(batch: list[Any]) -> list[Any]:
    """The loaders' ``collate_fn``: a batch stays a list of samples, as every system yields."""
    return batch


def loader_options(workers: int) -> dict[str, Any]:
    """Every loader's settings: batches of ``BATCH`` kept as lists, ``workers`` workers kept
    for the next epoch."""
    return {
        "batch_size": BATCH,
        "num_workers": workers,
        "persistent_workers": workers > 0,
        "collate_fn": as_list,
    }


def measure(
    build: Callable[[], Iterable[list[dict[str, Any]]]],
    before_epoch: Callable[[Any, int], None] | None = None,
) -> dict[str, float]:
    """Two epochs of the loader ``build`` makes: start-up, then the warm epoch's figures."""
    start = time.perf_counter()
    loader = build()
    startup = 0.0
    for epoch in range(2):
        if before_epoch is not None:
            before_epoch(loader, epoch)
        began = time.perf_counter()
        samples = ids = size = 0
        for batch in loader:
            if not startup:
                startup = time.perf_counter() - start
            for sample in batch:
                samples += 1
                ids += int(sample["id"])
                size += len(sample["data"])
        seconds = time.perf_counter() - began
    return {"startup": startup, "seconds": seconds, "samples": samples, "ids": ids, "bytes": size}


def _shard_rows(shard: str) -> Iterator[dict[str, Any]]:
    """The rows of one Parquet shard (also LitData's ``optimize`` function)."""
    import pyarrow.parquet as pq

    yield from pq.read_table(shard).to_pylist()


def _shards(parquet: Path) -> list[str]:
    return [str(p) for p in sorted(parquet.glob("*.parquet"))]


# -- Mosaic Streaming ------------------------------------------------------------------


def _mosaic_convert(parquet: Path, out: Path) -> None:
    from streaming import MDSWriter

    with MDSWriter(
        out=str(out), columns={"id": "int", "data": "bytes"}, size_limit=CHUNK_BYTES
    ) as w:
        for shard in _shards(parquet):
            for row in _shard_rows(shard):
                w.write(row)


def _mosaic_loader(out: Path, workers: int) -> Iterable[list[dict[str, Any]]]:
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    from torch.utils.data import DataLoader

    clean_stale_shared_memory()
    # batch_size tells the dataset how the loader batches (it partitions by it).
    dataset = StreamingDataset(local=str(out), shuffle=True, shuffle_seed=0, batch_size=BATCH)
    return DataLoader(dataset, **loader_options(workers))


# -- LitData ---------------------------------------------------------------------------


def _litdata_convert(parquet: Path, out: Path) -> None:
    import litdata

    litdata.optimize(
        fn=_shard_rows,
        inputs=_shards(parquet),
        output_dir=str(out.resolve()),
        chunk_bytes=CHUNK_BYTES,
        num_workers=2,
        mode="overwrite",
    )


def _litdata_loader(out: Path, workers: int) -> Iterable[list[dict[str, Any]]]:
    import litdata

    dataset = litdata.StreamingDataset(str(out.resolve()), shuffle=True, seed=0)
    loader: Iterable[list[dict[str, Any]]] = litdata.StreamingDataLoader(
        dataset, **loader_options(workers)
    )
    return loader


# -- WebDataset ------------------------------------------------------------------------


def _webdataset_convert(parquet: Path, out: Path) -> None:
    import webdataset as wds

    out.mkdir(parents=True)
    for i, shard in enumerate(_shards(parquet)):
        with wds.TarWriter(str(out / f"shard-{i:05d}.tar")) as w:
            for row in _shard_rows(shard):
                key = f"{row['id']:012d}"
                w.write({"__key__": key, "id": str(row["id"]).encode(), "bin": row["data"]})


def _webdataset_sample(raw: dict[str, Any]) -> dict[str, Any]:
    return {"id": int(raw["id"]), "data": raw["bin"]}


def _webdataset_loader(out: Path, workers: int) -> Iterable[list[dict[str, Any]]]:
    import webdataset as wds

    urls = [str(p) for p in sorted(out.glob("*.tar"))]
    dataset = (
        # empty_check off: a tiny run has fewer shards than workers (the sums still check)
        wds.WebDataset(urls, shardshuffle=len(urls), seed=0, empty_check=False)
        .shuffle(SHUFFLE_BUFFER)
        .map(_webdataset_sample)
    )
    loader: Iterable[list[dict[str, Any]]] = wds.WebLoader(dataset, **loader_options(workers))
    return loader


SYSTEMS: dict[str, tuple[Callable[[Path, Path], None], Callable[[Path, int], Any]]] = {
    "mosaic": (_mosaic_convert, _mosaic_loader),
    "litdata": (_litdata_convert, _litdata_loader),
    "webdataset": (_webdataset_convert, _webdataset_loader),
}


def main(system: str, parquet: Path, work: Path, workers: int) -> None:
    convert, loader = SYSTEMS[system]
    out = work / system
    if not out.exists():  # converted once per run, whatever the number of workers
        shutil.rmtree(work / f"{system}.partial", ignore_errors=True)
        began = time.perf_counter()
        convert(parquet, work / f"{system}.partial")
        (work / f"{system}.partial").rename(out)
        (work / f"{system}.convert").write_text(str(time.perf_counter() - began))
    report = measure(lambda: loader(out, workers))
    report["convert"] = float((work / f"{system}.convert").read_text())
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))
