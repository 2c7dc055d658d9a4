"""graben.dataloader: datasets as shards plus a manifest, at any URL.

``write_dataset(url, data)`` packs a pyarrow Table, dict rows or bytes samples
into Parquet or record shards and a ``manifest.json`` that lists them (one
read at start-up instead of a listing); ``read_manifest(url)`` reads it back.
``CachedDataset(url)`` reads it as a torch ``IterableDataset`` through a
node-local cache: every sample once per epoch across ranks and workers, in an
order fixed by ``(seed, epoch)``, resumable mid-epoch on any world size;
``CachedLoader`` is the DataLoader that knows how far the loop got.
``CachedMapDataset(url)`` reads the same shards and cache by index (``ds[i]``).
``index_files(url)`` makes files already in place a dataset, one sample a file.
"""

from typing import TYPE_CHECKING

from graben.store import optional_door as _optional_door

if TYPE_CHECKING:
    from ._cache import CacheStats, NodeCache
    from ._dataset import CachedDataset
    from ._loader import CachedLoader
    from ._manifest import Manifest, Shard
    from ._map import CachedMapDataset
    from ._writer import index_files, read_manifest, write_dataset

__all__ = [
    "CacheStats",
    "CachedDataset",
    "CachedLoader",
    "CachedMapDataset",
    "Manifest",
    "NodeCache",
    "Shard",
    "index_files",
    "read_manifest",
    "write_dataset",
]

# Without its extra, importing the door fails naming it; with it, each name's
# module is imported when the name is first used (``graben --help`` stays quick).
__getattr__ = _optional_door(
    __name__,
    "dataset",
    needs=("pyarrow", "torch", "numpy"),
    names={
        "._cache": ("CacheStats", "NodeCache"),
        "._dataset": ("CachedDataset",),
        "._loader": ("CachedLoader",),
        "._map": ("CachedMapDataset",),
        "._manifest": ("Manifest", "Shard"),
        "._writer": ("index_files", "read_manifest", "write_dataset"),
    },
)
