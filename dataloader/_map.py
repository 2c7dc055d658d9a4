"""``CachedMapDataset``: a torch map-style ``Dataset`` over the same shards and node cache.

Sample ``i`` is found from the manifest alone (which shard, which group in
it), its shard mapped from the node cache (fetched once per node), and its
group decoded. The readers of the last few shards used are kept, each
holding its last decoded group, so samples taken in order or in batches cost
one decode a group; a random order costs one a sample, so keep groups small
(``rows_per_group``) for random access, or read with ``CachedDataset``.
DataLoader's shuffle, ``DistributedSampler`` and any sampler work as on any
map-style dataset, with workers forked or spawned.
"""

from __future__ import annotations

import bisect
import itertools
import os
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from graben.store import InvalidArgument

from ._shards import Sample, ShardReader, ShardSource


class CachedMapDataset(ShardSource, Dataset[Sample]):
    """Samples of the dataset at ``url`` by index: ``ds[i]``, ``len(ds)``.

    ``open_shards`` readers are kept at once (each maps its shard and holds
    one decoded group); ``cache_dir``, ``cache_limit`` and
    ``storage_options`` are ``ShardSource``'s. ``classes`` names the values
    of a ``label`` column, and ``key(i)`` is a sample's name where it has one.
    """

    def __init__(
        self,
        url: str,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        open_shards: int = 4,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(
            url, cache_dir=cache_dir, cache_limit=cache_limit, storage_options=storage_options
        )
        if open_shards < 1:
            raise InvalidArgument(f"open_shards must be at least 1, not {open_shards}")
        self.open_shards = open_shards
        self._starts = [0, *itertools.accumulate(s.samples for s in self.manifest.shards)]
        self._readers: OrderedDict[int, ShardReader] = OrderedDict()

    @property
    def classes(self) -> tuple[str, ...]:
        """What each ``label`` value names (folder names, a column's values), if any."""
        return self.manifest.classes

    def __len__(self) -> int:
        return self._starts[-1]

    def __getitem__(self, index: int) -> Sample:
        shard, row = self._locate(index)
        (sample,) = self._read(shard, [row])
        return sample

    def __getitems__(self, indices: Sequence[int]) -> list[Sample]:
        """A batch of samples (what DataLoader asks for): each group decoded once."""
        located = [self._locate(i) for i in indices]
        out: list[Sample | None] = [None] * len(located)
        order = sorted(range(len(located)), key=located.__getitem__)
        for shard, run in itertools.groupby(order, key=lambda k: located[k][0]):
            slots = list(run)
            samples = self._read(shard, [located[k][1] for k in slots])
            for slot, sample in zip(slots, samples, strict=True):
                out[slot] = sample
        return out  # type: ignore[return-value]

    def key(self, index: int) -> str:
        """Sample ``index``'s name: its file for a dataset of files, else its ``key`` column."""
        shard, _ = self._locate(index)
        if self.manifest.kind == "files":
            return self.manifest.shards[shard].name
        if "key" not in self.manifest.columns:
            raise InvalidArgument("the samples have no keys (no 'key' column)", self.url)
        sample = self[index]
        assert isinstance(sample, dict)
        return str(sample["key"])

    def _locate(self, index: int) -> tuple[int, int]:
        """``(shard, row in it)`` of sample ``index`` (negative counts from the end)."""
        index = int(index)
        total = len(self)
        if index < 0:
            index += total
        if not 0 <= index < total:
            raise IndexError(f"index {index} out of range for {total} samples")
        shard = bisect.bisect_right(self._starts, index) - 1
        return shard, index - self._starts[shard]

    def _read(self, shard: int, rows: list[int]) -> list[Sample]:
        """The samples at ``rows`` of ``shard`` (rows in increasing order read best)."""
        reader, out = self._open(shard), list[Sample]()
        for group, run in itertools.groupby(rows, key=lambda r: _group_of(reader, r)):
            out.extend(reader.samples(group, np.array(list(run), dtype=np.int64)))
        return out

    def _open(self, shard: int) -> ShardReader:
        reader = self._readers.get(shard)
        if reader is not None:
            self._readers.move_to_end(shard)
            return reader
        while len(self._readers) >= self.open_shards:
            self._readers.popitem(last=False)  # unmapped before the next is mapped
        reader = self._readers[shard] = self._reader(shard)
        return reader

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_readers"] = OrderedDict()  # each worker maps its own
        return state


def _group_of(reader: ShardReader, row: int) -> int:
    return bisect.bisect_right(reader.starts, row) - 1
