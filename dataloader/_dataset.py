"""``CachedDataset``: a torch ``IterableDataset`` over a sharded dataset at any URL.

Start-up reads the manifest, one object. Each rank and DataLoader worker
reads its positions of the epoch's order (``_order``), loading one shard at a
time through the node cache (``_cache``) while background threads fill the
cache with the next ``prefetch`` shards it will need; only the shard being
read is held in memory. ``state_dict`` says how far the job has got;
``load_state_dict`` carries on from there, on any world size.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from ._cache import NodeCache
from ._manifest import Manifest, Shard
from ._order import Plan
from ._writer import RECORD_LENGTH, read_manifest

Sample = dict[str, Any] | bytes


class CachedDataset(IterableDataset[Sample]):
    """Samples of the dataset at ``url``, each once per epoch across ranks and workers.

    ``rank``/``world_size`` default to ``torch.distributed``'s (else 0 and 1).
    ``drop_last`` cuts the epoch to a multiple of the world size instead of
    padding it by wrapping round. ``worker_batch`` is the DataLoader's batch
    size (workers take turns by that many samples, so a rank sees its order).
    The cache is ``cache_dir`` (default: ``$TMPDIR/graben-dataset-cache``),
    shared by every process on the node, at most ``cache_limit`` bytes.
    """

    def __init__(
        self,
        url: str,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        prefetch: int = 2,
        worker_batch: int = 1,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.url, self.storage_options = url.rstrip("/"), storage_options or {}
        self.manifest: Manifest = read_manifest(self.url, self.storage_options)
        self.cache_dir = Path(cache_dir or Path(tempfile.gettempdir()) / "graben-dataset-cache")
        self.cache_limit = cache_limit
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.rank, self.world_size = _rank_and_world(rank, world_size)
        self.prefetch, self.worker_batch = prefetch, worker_batch
        self.epoch = 0
        self.start = 0
        """Position of the epoch the job had reached when this iteration began."""
        self.yielded = 0
        """Samples this process yielded since ``start`` (with no workers: the rank's)."""
        self.waited = 0.0
        """Seconds spent waiting for shards."""
        self._cache: NodeCache | None = None
        self._source: tuple[Any, str] | None = None

    # -- torch ----------------------------------------------------------------------

    def __len__(self) -> int:
        """Samples this rank reads in the current epoch from where it is."""
        return self._plan().per_rank(self.world_size, start=self.start, drop_last=self.drop_last)

    def __iter__(self) -> Iterator[Sample]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        plan = self._plan()
        order = plan.global_order()
        positions = plan.positions(
            self.rank,
            self.world_size,
            start=self.start,
            drop_last=self.drop_last,
            worker=worker,
            workers=workers,
            worker_batch=self.worker_batch,
        )
        pairs = order[positions] if len(positions) else np.zeros((0, 2), dtype=np.int64)
        self._node_cache()  # made here, not raced for by the prefetch threads
        self._fetch_source()
        threads = max(1, self.prefetch)
        with ThreadPoolExecutor(threads, thread_name_prefix="graben-prefetch") as pool:
            yield from self._samples(pairs, pool)

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its beginning (its order differs from every other's)."""
        self.epoch, self.start, self.yielded = epoch, 0, 0

    def state_dict(self, samples_seen: int | None = None) -> dict[str, int]:
        """Where the job is: ``samples_seen`` is what this rank consumed this epoch
        (default: what this process yielded, right with ``num_workers=0``)."""
        seen = self.yielded if samples_seen is None else samples_seen
        return {
            "epoch": self.epoch,
            "position": self.start + seen * self.world_size,
            "seed": self.seed,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Carry on from ``state`` (saved with any world size)."""
        if state.get("seed", self.seed) != self.seed:
            raise ValueError(f"state is for seed {state['seed']}, this dataset has {self.seed}")
        self.epoch, self.start, self.yielded = state["epoch"], state["position"], 0

    def warm(self) -> None:
        """Fill the node cache with every shard (as far as the limit allows)."""
        for index in range(len(self.manifest.shards)):
            self._warm(index)

    @property
    def stats(self) -> dict[str, float]:
        """Cache hits and fills, bytes fetched, seconds waited (this process)."""
        cache = self._node_cache().stats
        return {
            "cache_hits": cache.hits,
            "cache_fills": cache.fills,
            "bytes_fetched": cache.bytes_fetched,
            "refetched": cache.refetched,
            "seconds_waited": self.waited,
        }

    # -- reading --------------------------------------------------------------------

    def _plan(self) -> Plan:
        counts = [s.samples for s in self.manifest.shards]
        return Plan(counts, self.seed, self.epoch, self.shuffle)

    def _samples(self, pairs: np.ndarray, pool: ThreadPoolExecutor) -> Iterator[Sample]:
        runs = _runs(pairs[:, 0].tolist()) if len(pairs) else []
        upcoming = [shard for shard, _, _ in runs]
        warming: dict[int, Future[None]] = {}
        for index, (shard, lo, hi) in enumerate(runs):
            for ahead in dict.fromkeys(upcoming[index + 1 : index + 1 + self.prefetch]):
                if ahead not in warming:
                    warming[ahead] = pool.submit(self._warm, ahead)
            started = time.perf_counter()
            rows = self._load(shard)
            self.waited += time.perf_counter() - started
            for row in pairs[lo:hi, 1].tolist():
                self.yielded += 1
                yield rows[row]
            warming.pop(shard, None)

    def _node_cache(self) -> NodeCache:
        if self._cache is None:
            self._cache = NodeCache(self.cache_dir, self.cache_limit)
        return self._cache

    def _fetch_source(self) -> tuple[Any, str]:
        if self._source is None:  # once per process: an s3fs or graben client is not cheap
            self._source = fsspec.core.url_to_fs(self.url, **self.storage_options)
        return self._source

    def _fetch(self, shard: Shard) -> bytes:
        fs, root = self._fetch_source()
        data: bytes = fs.cat_file(f"{root}/{shard.name}")
        return data

    def _warm(self, index: int) -> None:
        shard = self.manifest.shards[index]
        self._node_cache().warm(self.url, shard, lambda: self._fetch(shard))

    def _load(self, index: int) -> list[Sample]:
        shard = self.manifest.shards[index]
        data = self._node_cache().read(self.url, shard, lambda: self._fetch(shard))
        if self.manifest.kind == "parquet":
            rows: list[Sample] = pq.read_table(pa.BufferReader(data)).to_pylist()
            return rows
        return _records(data)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cache"] = None  # each worker opens its own (the directory is shared)
        state["_source"] = None
        return state


def _rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is not None and world_size is not None:
        return rank, world_size
    if dist.is_available() and dist.is_initialized():
        return (
            dist.get_rank() if rank is None else rank,
            dist.get_world_size() if world_size is None else world_size,
        )
    return rank or 0, world_size or 1


def _runs(shards: list[int]) -> list[tuple[int, int, int]]:
    """``(shard, start, end)`` for each stretch of consecutive samples from one shard."""
    runs: list[tuple[int, int, int]] = []
    for i, shard in enumerate(shards):
        if runs and runs[-1][0] == shard and runs[-1][2] == i:
            runs[-1] = (shard, runs[-1][1], i + 1)
        else:
            runs.append((shard, i, i + 1))
    return runs


def _records(data: bytes) -> list[Sample]:
    samples: list[Sample] = []
    view, pos = memoryview(data), 0
    while pos < len(data):
        (length,) = RECORD_LENGTH.unpack_from(view, pos)
        samples.append(bytes(view[pos + 8 : pos + 8 + length]))
        pos += 8 + length
    return samples
