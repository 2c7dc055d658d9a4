"""graben.dataloader: datasets as shards plus a manifest, at any URL.

``write_dataset(url, data)`` packs a pyarrow Table, dict rows or bytes samples
into Parquet or record shards and a ``manifest.json`` that lists them (one
read at start-up instead of a listing); ``read_manifest(url)`` reads it back.
The caching reader (``CachedDataset``) is still to come.
"""

from ._manifest import Manifest, Shard
from ._writer import read_manifest, write_dataset

__all__ = ["Manifest", "Shard", "read_manifest", "write_dataset"]
