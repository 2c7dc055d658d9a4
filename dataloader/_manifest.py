"""A dataset's manifest: the one object a reader fetches to know every shard.

``manifest.json`` at the dataset's root lists each shard's file name, sample
count, size and crc32c, and the samples in each of its groups (Parquet row
groups, runs of records: the unit a reader decodes and shuffles within), so
that start-up is one small read: no listing of the
bucket, no per-shard request. It is written last, so a dataset is visible
only once all of its shards are.
"""

from __future__ import annotations

from typing import Literal

import msgspec

MANIFEST = "manifest.json"
"""The manifest's name under the dataset's root."""
VERSION = 1

Kind = Literal["parquet", "records", "files"]
"""``parquet``: rows, in row groups; ``records``: bytes samples, each after its
length; ``files``: one bytes sample a file, the files as they were."""


class Shard(msgspec.Struct, frozen=True):
    """One file of the dataset."""

    name: str
    """File name, relative to the dataset's root."""
    samples: int
    """Samples (rows, or records) in it."""
    size: int
    """Bytes in the file."""
    crc32c: int
    """crc32c of the whole file, checked when a copy lands in a cache."""
    groups: tuple[int, ...] = ()
    """Samples in each group, in order (empty: the whole shard is one group)."""

    def group_sizes(self) -> tuple[int, ...]:
        """Samples in each group, in order."""
        return self.groups or (self.samples,)


class Manifest(msgspec.Struct, frozen=True):
    """What a dataset holds."""

    kind: Kind
    shards: tuple[Shard, ...]
    columns: tuple[str, ...] = ()
    """Column names (Parquet)."""
    version: int = VERSION

    @property
    def samples(self) -> int:
        """Samples in the whole dataset."""
        return sum(s.samples for s in self.shards)

    @property
    def size(self) -> int:
        """Bytes in all shards."""
        return sum(s.size for s in self.shards)


def encode(manifest: Manifest) -> bytes:
    """The manifest's bytes (JSON, readable by people and other tools)."""
    return msgspec.json.format(msgspec.json.encode(manifest), indent=1)


def decode(data: bytes, where: str) -> Manifest:
    """Read a manifest; ``ValueError`` naming ``where`` if it is not one."""
    try:
        manifest = msgspec.json.decode(data, type=Manifest)
    except msgspec.DecodeError as exc:
        raise ValueError(f"{where}: not a graben dataset manifest ({exc})") from None
    if manifest.version != VERSION:
        raise ValueError(f"{where}: manifest version {manifest.version}, expected {VERSION}")
    return manifest
