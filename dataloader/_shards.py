"""Shards from the node cache, and the readers that take samples out of them.

``ShardSource`` is what ``CachedDataset`` and ``CachedMapDataset`` share: a
dataset's manifest, the node cache its shards are mapped from, and one
fsspec filesystem per process to fetch them with. A reader takes samples out
of one mapped shard a group at a time (a Parquet row group, a run of
records), decoding only that group.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from graben.store import IntegrityError, parse_size

from ._cache import CacheStats, Fetch, NodeCache, default_limit
from ._cache_dir import default_dir
from ._manifest import RECORD_LENGTH, Manifest, Shard
from ._s3 import RangeFetch, native_fetch
from ._writer import read_manifest

Sample = dict[str, Any] | bytes


class ShardSource:
    """The dataset at ``url``: its manifest, and its shards through the node cache.

    The cache is ``cache_dir`` (default: ``$XDG_CACHE_HOME/graben/datasets``,
    else ``~/.cache/graben/datasets``), shared by every process of its user on
    the node, at most ``cache_limit`` bytes (``"50G"``; default: 100 GiB, at
    most half its disk); a directory another user could write to is refused
    (``PermissionDenied``).
    """

    def __init__(
        self,
        url: str,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self.url, self.storage_options = url.rstrip("/"), storage_options or {}
        self.manifest: Manifest = read_manifest(self.url, self.storage_options)
        self.cache_dir = Path(cache_dir or default_dir())
        self.cache_limit = (
            default_limit(self.cache_dir) if cache_limit is None else parse_size(cache_limit)
        )
        self._cache: NodeCache | None = None
        self._source: tuple[Any, str] | None = None
        self._native: tuple[int, RangeFetch | None] | None = None

    def warm(self, progress: Callable[[int], None] | None = None) -> None:
        """Fill the node cache with every shard (as far as the limit allows).

        ``progress(size)`` is called with each shard's size once it is cached.
        """
        for index, shard in enumerate(self.manifest.shards):
            self._warm(index)
            if progress is not None:
                progress(shard.size)

    @property
    def cache_stats(self) -> CacheStats:
        """What the node cache did for this process: hits, fills, bytes fetched, refetches."""
        return self._node_cache().stats

    def _node_cache(self) -> NodeCache:
        if self._cache is None:
            self._cache = NodeCache(self.cache_dir, self.cache_limit)
        return self._cache

    def _fetch_source(self) -> tuple[Any, str]:
        if self._source is None:  # once per process: an s3fs or graben client is not cheap
            self._source = fsspec.core.url_to_fs(self.url, **self.storage_options)
        return self._source

    def _fetch(self, shard: Shard) -> Fetch:
        if self._native is None or self._native[0] != os.getpid():  # once per process
            self._native = (os.getpid(), native_fetch(self.url, self.storage_options))
        native = self._native[1]
        if native is not None:
            return lambda start, end: native(shard.name, start, end)
        fs, root = self._fetch_source()

        def fetch(start: int, end: int) -> bytes:
            # by keyword: s3fs's third positional parameter is a version id
            data: bytes = fs.cat_file(f"{root}/{shard.name}", start=start, end=end)
            return data

        return fetch

    def _warm(self, index: int) -> None:
        shard = self.manifest.shards[index]
        self._node_cache().warm(self.url, shard, self._fetch(shard))

    def _reader(self, index: int) -> ShardReader:
        shard = self.manifest.shards[index]
        view = self._node_cache().open(self.url, shard, self._fetch(shard))
        return READERS[self.manifest.kind](shard, view)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cache"] = None  # each worker opens its own (the directory is shared)
        state["_source"] = None
        state["_native"] = None
        return state


class ShardReader:
    """One mapped shard's samples, a group at a time."""

    def __init__(self, shard: Shard, view: memoryview) -> None:
        self.shard, self.view = shard, view
        sizes = shard.group_sizes()
        self.starts = [0, *itertools.accumulate(sizes)]

    def samples(self, group: int, rows: np.ndarray) -> Iterator[Sample]:
        """The samples at ``rows`` (counted from the shard's start), all in ``group``."""
        raise NotImplementedError


class _ParquetReader(ShardReader):
    def __init__(self, shard: Shard, view: memoryview) -> None:
        super().__init__(shard, view)
        self.file = pq.ParquetFile(pa.BufferReader(pa.py_buffer(view)))
        self.group, self.table = -1, pa.table({})
        meta = self.file.metadata
        found = tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
        if (found or (0,)) != shard.group_sizes():
            # rows are taken by the manifest's groups: a lie would read past them
            raise IntegrityError(
                f"shard {shard.name}: its row groups hold {found} rows,"
                f" its manifest says {shard.group_sizes()}"
            )

    def samples(self, group: int, rows: np.ndarray) -> Iterator[Sample]:
        # docstring inherited
        table = self._decoded(group)
        local = rows - self.starts[group]
        if 2 * len(local) < table.num_rows:  # a few rows of the group: convert only those
            taken: list[Sample] = table.take(pa.array(local)).to_pylist()
            return iter(taken)
        # Most of it: converting the whole group and picking is twice as fast as
        # take() + to_pylist() (1.5M against 0.7M rows/s of 4 KiB here). Not kept:
        # a row handed out twice (padding) must not be a sample the loop changed.
        whole = table.to_pylist()
        return (whole[i] for i in local.tolist())

    def _decoded(self, group: int) -> pa.Table:
        """``group`` decoded (this group only); the last one is kept for the next call."""
        if self.group != group:
            self.group, self.table = -1, pa.table({})  # one decoded group at a time, not two
            self.table, self.group = self.file.read_row_group(group), group
        return self.table


class _RecordReader(ShardReader):
    def __init__(self, shard: Shard, view: memoryview) -> None:
        super().__init__(shard, view)
        self.spans = _record_spans(view, shard.samples)

    def samples(self, group: int, rows: np.ndarray) -> Iterator[Sample]:
        # docstring inherited
        view, spans = self.view, self.spans
        for row in rows.tolist():
            start, end = spans[row]
            yield bytes(view[start:end])


class _FileReader(ShardReader):
    def samples(self, group: int, rows: np.ndarray) -> Iterator[Sample]:
        # docstring inherited
        for _ in range(len(rows)):
            yield bytes(self.view)


READERS: dict[str, type[ShardReader]] = {
    "parquet": _ParquetReader,
    "records": _RecordReader,
    "files": _FileReader,
}


def _record_spans(view: memoryview, samples: int) -> list[tuple[int, int]]:
    """Where each record's sample starts and ends."""
    spans, pos = [], 0
    for _ in range(samples):
        if pos + RECORD_LENGTH.size > len(view):
            break
        (length,) = RECORD_LENGTH.unpack_from(view, pos)
        spans.append((pos + 8, pos + 8 + length))
        pos += 8 + length
    if pos != len(view) or len(spans) != samples:
        raise IntegrityError(
            f"a record shard of {len(view)} bytes ends its {samples} records at {pos}"
        )
    return spans
