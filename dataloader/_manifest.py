"""A dataset's manifest: the one object a reader fetches to know every shard.

``manifest.json`` at the dataset's root lists each shard's file name, sample
count, size and crc32c, and the samples in each of its groups (Parquet row
groups, runs of records: the unit a reader decodes and shuffles within), so
that start-up is one small read: no listing of the
bucket, no per-shard request. It is written last, so a dataset is visible
only once all of its shards are.

A manifest is checked before anything it names is fetched (``decode``): each
shard's name must be a plain relative path inside the dataset, named once, and
its counts must be sane and agree with each other and with its format, so that
neither a name like ``../../etc/hostname`` nor a claim of 2^40 samples in a
few bytes reaches a reader.
"""

from __future__ import annotations

import struct
from typing import Literal

import msgspec

from graben.store import InvalidArgument

MANIFEST = "manifest.json"
"""The manifest's name under the dataset's root."""
VERSION = 1
MAX_SAMPLES = 1 << 32
"""Samples a manifest may claim, in a shard or in all: a reader keeps the epoch's
order in memory (24 bytes a sample), so a false claim would be a huge allocation."""
MAX_SHARD_BYTES = 1 << 40
"""Bytes a shard may have (1 TiB): a cache fill reserves them before fetching."""
MAX_NAME = 4096
"""Characters a shard's name may have (``PATH_MAX``)."""
RECORD_LENGTH = struct.Struct("<Q")
"""What comes before each sample in a record shard: the least a record takes."""

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
    classes: tuple[str, ...] = ()
    """What each value of the ``label`` column names, in order (folder names, a
    column's values); empty when the samples have no labels. Manifests written
    before labels existed have none, and read as before."""

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
    """Read a manifest; ``InvalidArgument`` naming ``where`` if it is not a sane one."""
    try:
        manifest = msgspec.json.decode(data, type=Manifest)
    except msgspec.DecodeError as exc:
        raise InvalidArgument(f"{where}: not a graben dataset manifest ({exc})") from None
    return check(manifest, where)


def check(manifest: Manifest, where: str) -> Manifest:
    """``manifest`` if sane; else ``InvalidArgument`` naming ``where``, the shard and the field."""
    if manifest.version != VERSION:
        raise InvalidArgument(f"{where}: manifest version {manifest.version}, expected {VERSION}")
    first: dict[str, int] = {}  # each name, and the shard it was first seen at
    for index, shard in enumerate(manifest.shards):
        problem = name_problem(shard.name) or _count_problem(manifest.kind, shard)
        if problem is None and first.setdefault(shard.name, index) != index:
            problem = (
                f"shard {first[shard.name]} has the same name: a shard is listed once"
                " (listed again, its samples would be read again, each epoch)"
            )
        if problem is not None:
            raise InvalidArgument(f"{where}: shard {index} ({_shown(shard.name)}): {problem}")
    if manifest.samples > MAX_SAMPLES:
        raise InvalidArgument(
            f"{where}: {manifest.samples} samples in all, more than a manifest may claim"
            f" ({MAX_SAMPLES})"
        )
    return manifest


def name_problem(name: str) -> str | None:
    """What keeps ``name`` from being a file inside a dataset, or ``None``: a
    shard is fetched at ``root + "/" + name``, so the name must stay below the root."""
    if not name:
        return "the name is empty"
    if len(name) > MAX_NAME:
        return f"the name is {len(name)} characters long, more than {MAX_NAME}"
    if "\0" in name:
        return "the name holds a NUL character"
    if "\\" in name:  # a separator to some stores and systems: ``..\\x`` climbs there
        return "the name holds a backslash (parts of a name are separated by '/')"
    if not _utf8(name):
        return "the name is not valid UTF-8"
    return _path_problem(name.split("/"))


def _path_problem(parts: list[str]) -> str | None:
    if parts[0] == "":
        return "the name is absolute (it must be relative to the dataset's root)"
    if ".." in parts:
        return "the name climbs out of the dataset with '..'"
    if "" in parts or "." in parts:
        return "the name is not a normal path (no '.' parts, no '//', no trailing '/')"
    return None


def _utf8(name: str) -> bool:
    try:
        name.encode()
    except UnicodeEncodeError:  # a lone surrogate: no file system or store can name it
        return False
    return True


def _count_problem(kind: Kind, shard: Shard) -> str | None:
    """What makes the shard's counts insane or inconsistent, or ``None``."""
    if not 0 <= shard.size <= MAX_SHARD_BYTES:
        return f"size {shard.size} is not between 0 and {MAX_SHARD_BYTES} bytes"
    if not 0 <= shard.crc32c < 1 << 32:
        return f"crc32c {shard.crc32c} is not a 32-bit checksum"
    if not 0 <= shard.samples <= MAX_SAMPLES:
        return f"samples {shard.samples} is not between 0 and {MAX_SAMPLES}"
    if any(count < 0 for count in shard.groups):
        return f"groups {shard.groups} hold a negative count"
    if shard.groups and sum(shard.groups) != shard.samples:
        return (
            f"groups {shard.groups} add up to {sum(shard.groups)},"
            f" not to the shard's {shard.samples} samples"
        )
    return _format_problem(kind, shard)


def _format_problem(kind: Kind, shard: Shard) -> str | None:
    """What the shard's format rules out. Parquet sets no bound of samples by
    bytes (run-length encoding holds any number of equal rows in a few bytes)."""
    if kind == "records" and shard.samples * RECORD_LENGTH.size > shard.size:
        return (
            f"samples {shard.samples} cannot fit in {shard.size} bytes"
            f" (a record takes at least {RECORD_LENGTH.size})"
        )
    if kind == "files" and shard.samples != 1:
        return f"samples {shard.samples}: a shard of kind 'files' is one sample"
    return None


def _shown(name: str) -> str:
    """The name as a message shows it: quoted, and cut if it is long."""
    return repr(name) if len(name) <= 100 else f"{name[:100]!r}..."
