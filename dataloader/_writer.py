"""Packing samples into shards at any URL: ``write_dataset``.

Rows (a pyarrow ``Table``, or dicts) become Parquet shards of
``rows_per_shard`` rows in row groups of ``rows_per_group``; bytes samples
become record shards, each sample after its length (8 bytes, little
endian), in groups of ``rows_per_group`` records. Every shard is built in
memory, checksummed and written with one call; the manifest goes last.
``index_files`` makes files already in place a dataset, one sample a file.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Iterator
from typing import Any

import crc32c
import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from graben.store import InvalidArgument

from ._manifest import (
    MANIFEST,
    RECORD_LENGTH,
    Kind,
    Manifest,
    Shard,
    check,
    decode,
    encode,
    name_problem,
)

Sample = bytes | bytearray | memoryview


def write_dataset(
    url: str,
    data: Any,
    *,
    rows_per_shard: int = 10_000,
    rows_per_group: int | None = None,
    compression: str | None = "zstd",
    storage_options: dict[str, Any] | None = None,
) -> Manifest:
    """Write ``data`` as shards plus a manifest under ``url`` (any fsspec URL or a path).

    ``data``: a pyarrow ``Table``, an iterable of dict rows (one column per
    key), or an iterable of bytes samples. ``rows_per_group`` (default: a
    tenth of a shard) is the unit a reader fetches; ``compression`` applies
    to Parquet; ``storage_options`` go to fsspec (an ``s3://`` endpoint, keys).
    Returns the manifest written.
    """
    if rows_per_shard < 1:
        raise ValueError("rows_per_shard must be at least 1")
    group = rows_per_group or max(1, rows_per_shard // 10)
    kind, batches = _batches(data, rows_per_shard)  # refuses bad data before any write
    fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    fs.makedirs(root, exist_ok=True)
    shards, columns = [], ()
    for index, batch in enumerate(batches):
        if isinstance(batch, pa.Table):
            columns = tuple(batch.column_names)
            payload = _parquet(batch, group, compression)
            groups = _groups(payload)
            name, samples = f"shard-{index:05d}.parquet", batch.num_rows
        else:
            payload, groups = _records(batch), _runs(len(batch), group)
            name, samples = f"shard-{index:05d}.records", len(batch)
        fs.pipe_file(f"{root}/{name}", payload)
        shards.append(Shard(name, samples, len(payload), crc32c.crc32c(payload), groups))
    manifest = check(Manifest(kind, tuple(shards), columns), url)  # as a reader will
    fs.pipe_file(f"{root}/{MANIFEST}", encode(manifest))
    return manifest


def _batches(data: Any, rows: int) -> tuple[Kind, Iterator[Any]]:
    if isinstance(data, pa.Table):
        return "parquet", (data.slice(i, rows) for i in range(0, max(data.num_rows, 1), rows))
    items: Iterator[Any] = iter(data)
    first = next(items, None)
    if first is None:
        raise ValueError("write_dataset: no samples")
    items = itertools.chain([first], items)
    if isinstance(first, dict):
        return "parquet", (pa.Table.from_pylist(list(b)) for b in _chunked(items, rows))
    if isinstance(first, bytes | bytearray | memoryview):
        return "records", (list(b) for b in _chunked(items, rows))
    raise TypeError(f"write_dataset: samples must be dicts or bytes, not {type(first).__name__}")


def _chunked(items: Iterator[Any], size: int) -> Iterator[tuple[Any, ...]]:
    while batch := tuple(itertools.islice(items, size)):
        yield batch


def _parquet(table: pa.Table, group: int, compression: str | None) -> bytes:
    out = io.BytesIO()
    pq.write_table(table, out, row_group_size=group, compression=compression or "none")
    return out.getvalue()


def _groups(payload: bytes) -> tuple[int, ...]:
    """Rows in each row group, as written."""
    meta = pq.ParquetFile(io.BytesIO(payload)).metadata
    return tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))


def _runs(samples: int, group: int) -> tuple[int, ...]:
    """Samples in each group of ``group`` consecutive records."""
    return tuple(min(group, samples - i) for i in range(0, samples, group))


def _records(samples: list[Sample]) -> bytes:
    out = io.BytesIO()
    for sample in samples:
        view = memoryview(sample)
        out.write(RECORD_LENGTH.pack(view.nbytes))
        out.write(view)
    return out.getvalue()


def read_manifest(url: str, storage_options: dict[str, Any] | None = None) -> Manifest:
    """The manifest of the dataset at ``url`` (``FileNotFoundError`` if there is none)."""
    fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    where = f"{root}/{MANIFEST}"
    return decode(fs.cat_file(where), where)


def index_files(url: str, *, storage_options: dict[str, Any] | None = None) -> Manifest:
    """Make every file under ``url`` a sample of a dataset there, in place: writes the manifest.

    Each file is read once, for its crc32c; nothing is copied. Names starting
    with ``.`` and an earlier manifest are left out. Returns the manifest.
    """
    fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    root = root.rstrip("/")
    shards = []
    for path in sorted(fs.find(root)):
        name = path[len(root) + 1 :]
        if name == MANIFEST or any(part.startswith(".") for part in name.split("/")):
            continue
        if (problem := name_problem(name)) is not None:  # no reader would take the manifest
            raise InvalidArgument(f"index_files: cannot index {path}: {problem}")
        data = fs.cat_file(path)
        shards.append(Shard(name, 1, len(data), crc32c.crc32c(data)))
    if not shards:
        raise ValueError(f"index_files: no files under {url}")
    manifest = check(Manifest("files", tuple(shards)), url)
    fs.pipe_file(f"{root}/{MANIFEST}", encode(manifest))
    return manifest
