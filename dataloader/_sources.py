"""What ``graben dataset write`` packs: local Parquet or files, streamed as record batches.

Parquet is read a batch at a time (never a whole file, never a whole
directory), so memory holds a batch and the shard being built. A directory
of other files becomes rows of ``key`` (the file's path under the
directory), ``data`` (its bytes) and, when every file sits in a folder, as
torchvision's ``ImageFolder`` lays a dataset out, ``label`` (the index of
its top folder's name among the sorted folder names: the manifest's
``classes``). A Parquet column can give the labels too (``label_column``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from graben.store import InvalidArgument, NotFound

BATCH_ROWS = 8192
"""Rows read from a Parquet file at a time."""
FILES_BATCH = 256
"""Files read into one batch at most ..."""
FILES_BATCH_BYTES = 16 << 20
"""... and bytes: a batch is cut at whichever comes first."""


def source_batches(
    source: Path, *, label_column: str | None = None
) -> tuple[Iterator[pa.RecordBatch], tuple[str, ...]]:
    """``source``'s rows as record batches, and the classes its labels name (or none)."""
    if source.is_file():
        return _parquet([source], label_column)
    if not source.is_dir():
        raise NotFound("no such file or directory", str(source))
    files = sorted(
        p
        for p in source.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(source).parts)
    )
    if not files:
        raise InvalidArgument("the source holds no files", str(source))
    if all(p.suffix == ".parquet" for p in files):
        return _parquet(files, label_column)
    if label_column is not None:
        raise InvalidArgument(
            "--label-column is for Parquet; the labels of files come from their folders"
        )
    return _files(source, files)


def _parquet(
    files: list[Path], label_column: str | None
) -> tuple[Iterator[pa.RecordBatch], tuple[str, ...]]:
    if label_column is None:
        return _read(files, None, None), ()
    values = _label_values(files, label_column)  # one column, file by file: small
    classes = tuple(str(v) for v in values.to_pylist())
    return _read(files, label_column, values), classes


def _label_values(files: list[Path], column: str) -> pa.Array:
    seen: list[pa.Array] = []
    for path in files:
        schema = pq.read_schema(path)
        if column not in schema.names:
            raise InvalidArgument(
                f"no column {column!r} (it has {', '.join(schema.names)})", str(path)
            )
        if column != "label" and "label" in schema.names:
            already = "a 'label' column already; use --label-column label, or rename it"
            raise InvalidArgument(already, str(path))
        seen.append(pc.unique(pq.read_table(path, columns=[column])[column]))
    values = pc.unique(pa.chunked_array(seen))
    return pc.take(values, pc.sort_indices(values)).drop_null()


def _read(
    files: list[Path], label_column: str | None, values: pa.Array | None
) -> Iterator[pa.RecordBatch]:
    for path in files:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS):
            if label_column is None or values is None:
                yield batch
                continue
            label = pc.index_in(batch[label_column], value_set=values).cast(pa.int32())
            columns = dict(zip(batch.schema.names, batch.columns, strict=True))
            columns["label"] = label  # replaces the column if it was 'label', else joins them
            yield pa.RecordBatch.from_pydict(columns)


def _files(source: Path, files: list[Path]) -> tuple[Iterator[pa.RecordBatch], tuple[str, ...]]:
    keys = [p.relative_to(source).as_posix() for p in files]
    foldered = all("/" in key for key in keys)
    classes = tuple(sorted({key.split("/", 1)[0] for key in keys})) if foldered else ()
    return _file_batches(files, keys, classes), classes


def _file_batches(
    files: list[Path], keys: list[str], classes: tuple[str, ...]
) -> Iterator[pa.RecordBatch]:
    index = {name: i for i, name in enumerate(classes)}
    rows: dict[str, list[object]] = {"key": [], "data": []}
    if classes:
        rows["label"] = []
    size = 0
    for path, key in zip(files, keys, strict=True):
        data = path.read_bytes()
        rows["key"].append(key)
        rows["data"].append(data)
        if classes:
            rows["label"].append(index[key.split("/", 1)[0]])
        size += len(data)
        if len(rows["key"]) >= FILES_BATCH or size >= FILES_BATCH_BYTES:
            yield _file_batch(rows)
            rows, size = {name: [] for name in rows}, 0
    if rows["key"]:
        yield _file_batch(rows)


def _file_batch(rows: dict[str, list[object]]) -> pa.RecordBatch:
    arrays = {
        "key": pa.array(rows["key"], pa.string()),
        "data": pa.array(rows["data"], pa.large_binary()),
    }
    if "label" in rows:
        arrays["label"] = pa.array(rows["label"], pa.int32())
    return pa.RecordBatch.from_pydict(arrays)
