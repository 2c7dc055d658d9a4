"""Packing samples into shards at any URL: ``write_dataset``.

Rows (a pyarrow ``Table``, a stream of record batches or tables, or dicts)
become Parquet shards; bytes samples become record shards, each sample after
its length (8 bytes, little endian). A shard ends at ``rows_per_shard`` rows
or once it holds ``shard_size`` bytes, whichever comes first; within it,
groups (Parquet row groups, runs of records: what a reader decodes at once)
end at ``rows_per_group`` rows or a tenth of ``shard_size``. Input is taken
as it comes, so memory holds one shard being built, whatever the dataset's
size. Every shard is checksummed and written with one call; the manifest
goes last. ``index_files`` makes files already in place a dataset, one
sample a file.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import crc32c
import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from graben.store import GrabenFileSystem, InvalidArgument, parse_size, split_url

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
ROWS_PER_SHARD = 10_000
"""Rows in a shard when neither ``rows_per_shard`` nor ``shard_size`` is given."""


def write_dataset(
    url: str,
    data: Any,
    *,
    rows_per_shard: int | None = None,
    rows_per_group: int | None = None,
    shard_size: int | str | None = None,
    compression: str | None = "zstd",
    classes: Iterable[str] = (),
    storage_options: dict[str, Any] | None = None,
    storage_class: str | None = None,
) -> Manifest:
    """Write ``data`` as shards plus a manifest under ``url`` (any fsspec URL or a path).

    ``data``: a pyarrow ``Table``, an iterable of ``RecordBatch`` or ``Table``
    (streamed: one shard in memory at a time), of dict rows (one column per
    key), or of bytes samples. A shard ends at ``rows_per_shard`` rows or
    ``shard_size`` bytes (``"256MiB"``; default: 10,000 rows if neither is
    given); ``rows_per_group`` (default: a tenth of a shard) is the unit a
    reader fetches. ``compression`` applies to Parquet. ``classes`` names the
    values of an integer ``label`` column, in order (a reader's
    ``manifest.classes``). ``storage_options`` go to fsspec (an ``s3://``
    endpoint, keys). ``storage_class`` (a ``graben://`` URL only: ``"ec:6+3"``) is set
    on the dataset's directory before any shard is written, so the shards take it as
    soon as each is closed. Returns the manifest written.
    """
    limits = _Limits.of(rows_per_shard, rows_per_group, shard_size)
    kind, batches = _batches(data)  # refuses bad data before any write
    fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    if storage_class is not None and not isinstance(fs, GrabenFileSystem):
        raise InvalidArgument(f"storage_class needs a graben:// dataset URL, not {url!r}")
    fs.makedirs(root, exist_ok=True)
    if isinstance(fs, GrabenFileSystem) and storage_class is not None:
        fs.client.set_class(split_url(url)[1], storage_class)
    builder = _Shards(fs, root, limits, compression)
    for batch in batches:
        builder.add(batch)
    shards, columns = builder.finish()
    manifest = Manifest(kind, tuple(shards), columns, classes=tuple(classes))
    check(manifest, url)  # as a reader will
    fs.pipe_file(f"{root}/{MANIFEST}", encode(manifest))
    return manifest


class _Limits:
    """Where shards and groups end, by rows and by bytes (``None``: no bound)."""

    def __init__(self, shard_rows: int | None, group_rows: int | None, shard_bytes: int | None):
        self.shard_rows, self.group_rows, self.shard_bytes = shard_rows, group_rows, shard_bytes
        self.group_bytes = None if shard_bytes is None else max(1, shard_bytes // 10)

    @classmethod
    def of(cls, rows: int | None, group: int | None, size: int | str | None) -> _Limits:
        shard_bytes = None if size is None else parse_size(size)
        if rows is None and shard_bytes is None:
            rows = ROWS_PER_SHARD
        for name, value in (("rows_per_shard", rows), ("rows_per_group", group)):
            if value is not None and value < 1:
                raise InvalidArgument(f"{name} must be at least 1, not {value}")
        if shard_bytes is not None and shard_bytes < 1:
            raise InvalidArgument("shard_size must be at least 1 byte")
        if group is None and rows is not None:
            group = max(1, rows // 10)
        return cls(rows, group, shard_bytes)

    def rows_to_take(self, shard_rows: int, group_rows: int, group_bytes: int, batch: Any) -> int:
        """Rows of ``batch`` that fit in the group being built (at least one)."""
        take = len(batch)
        if self.shard_rows is not None:
            take = min(take, self.shard_rows - shard_rows)
        if self.group_rows is not None:
            take = min(take, self.group_rows - group_rows)
        if self.group_bytes is not None and len(batch):
            per_row = max(1, _nbytes(batch) // len(batch))
            take = min(take, -(-(self.group_bytes - group_bytes) // per_row))
        return max(1, take)

    def group_full(self, rows: int, size: int) -> bool:
        return (self.group_rows is not None and rows >= self.group_rows) or (
            self.group_bytes is not None and size >= self.group_bytes
        )

    def shard_full(self, rows: int, size: int) -> bool:
        return (self.shard_rows is not None and rows >= self.shard_rows) or (
            self.shard_bytes is not None and size >= self.shard_bytes
        )


def _dictionary_columns(schema: pa.Schema) -> list[str]:
    """The columns worth dictionary-encoding: all but binary ones.

    A binary column holds payloads (images, token runs), nearly all distinct:
    a dictionary of them is pure cost, and decoding one read a shard's row
    groups at a third of the speed of plain pages (395k against 1.2M rows/s
    of 4 KiB here). Strings and numbers (labels, ids) keep it.
    """
    binary = (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_fixed_size_binary)
    return [f.name for f in schema if not any(is_(f.type) for is_ in binary)]


class _Shards:
    """Shards built from batches as they come, each written once it is full."""

    def __init__(self, fs: Any, root: str, limits: _Limits, compression: str | None) -> None:
        self.fs, self.root, self.limits, self.compression = fs, root, limits, compression
        self.shards: list[Shard] = []
        self.columns: tuple[str, ...] = ()
        self.schema: pa.Schema | None = None
        self.pending: list[Any] = []  # the group being built: slices of batches
        self.pending_rows = self.pending_bytes = 0
        self.groups: list[int] = []  # rows in each group of the shard being built
        self.shard_rows = 0  # their sum
        self.sink: Any = None
        self.writer: pq.ParquetWriter | None = None

    def add(self, batch: Any) -> None:
        if not isinstance(batch, list):
            batch = self._conform(batch)
        while len(batch):
            take = self.limits.rows_to_take(
                self.shard_rows + self.pending_rows, self.pending_rows, self.pending_bytes, batch
            )
            piece, batch = batch[:take], batch[take:]
            self.pending.append(piece)
            self.pending_rows += len(piece)
            self.pending_bytes += _nbytes(piece)
            if self.limits.group_full(self.pending_rows, self.pending_bytes) or (
                self.limits.shard_full(self.shard_rows + self.pending_rows, 0)  # rows alone
            ):
                self._flush_group()
                if self.limits.shard_full(self.shard_rows, self._written()):
                    self._finish_shard()

    def finish(self) -> tuple[list[Shard], tuple[str, ...]]:
        self._flush_group()
        self._finish_shard()
        if not self.shards and self.schema is not None:  # no rows: one empty shard, for the
            self._open(pa.table({n: [] for n in self.schema.names}, schema=self.schema))  # columns
            self._finish_shard()
        return self.shards, self.columns

    def _flush_group(self) -> None:
        if not self.pending:
            return
        if isinstance(self.pending[0], list):  # bytes samples
            if self.sink is None:
                self.sink = io.BytesIO()
            for sample in itertools.chain.from_iterable(self.pending):
                view = memoryview(sample)
                self.sink.write(RECORD_LENGTH.pack(view.nbytes))
                self.sink.write(view)
        else:
            table = pa.Table.from_batches(
                [b for p in self.pending for b in _record_batches(p)], schema=self.schema
            )
            if self.writer is None:
                self._open(table)
            assert self.writer is not None
            self.writer.write_table(table, row_group_size=max(1, table.num_rows))
        self.groups.append(self.pending_rows)
        self.shard_rows += self.pending_rows
        self.pending, self.pending_rows, self.pending_bytes = [], 0, 0

    def _open(self, table: pa.Table) -> None:
        self.sink = pa.BufferOutputStream()
        self.writer = pq.ParquetWriter(
            self.sink,
            table.schema,
            compression=self.compression or "none",
            use_dictionary=_dictionary_columns(table.schema),
        )
        if table.num_rows == 0:
            self.writer.write_table(table)

    def _written(self) -> int:
        return 0 if self.sink is None else int(self.sink.tell())

    def _finish_shard(self) -> None:
        if self.sink is None:
            return
        if self.writer is not None:
            self.writer.close()
            payload: bytes = self.sink.getvalue().to_pybytes()
            suffix = "parquet"
        else:
            payload, suffix = self.sink.getvalue(), "records"
        name = f"shard-{len(self.shards):05d}.{suffix}"
        self.fs.pipe_file(f"{self.root}/{name}", payload)
        groups = tuple(self.groups) if self.shard_rows else ()  # an empty shard: no groups
        shard = Shard(name, self.shard_rows, len(payload), crc32c.crc32c(payload), groups)
        self.shards.append(shard)
        self.sink, self.writer, self.groups, self.shard_rows = None, None, [], 0

    def _conform(self, batch: Any) -> Any:
        """``batch`` in the dataset's schema (the first batch's): every shard has the same."""
        if self.schema is None:
            self.schema, self.columns = batch.schema, tuple(batch.schema.names)
            return batch
        if batch.schema.equals(self.schema):
            return batch
        try:  # dict rows: a chunk of all-null values comes out typed ``null``
            return batch.cast(self.schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
            raise InvalidArgument(
                f"write_dataset: rows with columns {batch.schema.names} ({batch.schema.types})"
                f" after {self.schema.names} ({self.schema.types}): every batch needs one schema"
            ) from None


def _nbytes(piece: Any) -> int:
    if isinstance(piece, list):
        return sum(memoryview(s).nbytes + RECORD_LENGTH.size for s in piece)
    return int(piece.nbytes)


def _record_batches(piece: Any) -> list[pa.RecordBatch]:
    if isinstance(piece, pa.RecordBatch):
        return [piece]
    batches: list[pa.RecordBatch] = piece.to_batches()
    return batches


def _batches(data: Any) -> tuple[Kind, Iterator[Any]]:
    """What kind of dataset ``data`` makes, and its samples as batches (tables or lists)."""
    if isinstance(data, pa.Table | pa.RecordBatch):
        data = [data]
    items: Iterator[Any] = iter(data)
    first = next(items, None)
    if first is None:
        raise InvalidArgument("write_dataset: no samples")
    items = itertools.chain([first], items)
    if isinstance(first, pa.Table | pa.RecordBatch):
        return "parquet", _typed(items, (pa.Table, pa.RecordBatch), "tables or record batches")
    if isinstance(first, dict):
        return "parquet", (pa.Table.from_pylist(list(b)) for b in _chunked(items, 1024))
    if isinstance(first, bytes | bytearray | memoryview):
        return "records", (list(b) for b in _chunked(_typed(items, Sample, "bytes"), 1024))
    raise InvalidArgument(
        f"write_dataset: samples must be dicts or bytes, not {type(first).__name__}"
    )


def _typed(items: Iterator[Any], kind: Any, said: str) -> Iterator[Any]:
    for item in items:
        if not isinstance(item, kind):
            raise InvalidArgument(f"write_dataset: expected {said}, found {type(item).__name__}")
        yield item


def _chunked(items: Iterator[Any], size: int) -> Iterator[tuple[Any, ...]]:
    while batch := tuple(itertools.islice(items, size)):
        yield batch


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
        raise InvalidArgument("index_files: the URL holds no files", url)
    manifest = check(Manifest("files", tuple(shards)), url)
    fs.pipe_file(f"{root}/{MANIFEST}", encode(manifest))
    return manifest
