"""Metadata by rank: what lets a rank load without reading the whole world's.

DCP's ``.metadata`` describes every chunk every rank saved. At 4096 ranks x
300 tensors that is ~50 MB that each loading rank reads and unpickles. A
graben checkpoint also keeps, beside it:

- ``.graben/__R.metadata``: rank file R's part of the metadata (its items'
  chunks and where their bytes lie), a stock ``Metadata`` pickled;
- ``.graben/directory``: every key, which rank files hold it, and each
  tensor's global size (a few KB).

A loading rank reads the directory, then for each tensor guesses the rank
files whose chunks overlap its own from the geometry (sharding along the
first dimension is proportional), reads those, and checks that the chunks
found cover what it needs. Anything not covered falls back to the full
``.metadata``, read once: never wrong, only slower.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import msgspec
from torch.distributed.checkpoint.metadata import (
    STORAGE_TYPES,
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult

DIRECTORY = ".graben/directory"
"""The checkpoint's directory of keys, relative to the checkpoint."""

GUESS_SLACK = 1
"""Rank files read on each side of the proportional guess when it fell short."""


def rank_metadata_name(rank: int) -> str:
    """Rank file ``rank``'s metadata, relative to the checkpoint."""
    return f".graben/__{rank}.metadata"


class Held(msgspec.Struct, frozen=True, array_like=True):
    """Where one key's items are: which rank files, and the tensor's size."""

    ranks: list[tuple[int, int]]
    """Ranges ``[first, end)`` of the rank files holding its items, in order."""
    size: list[int] | None
    """The tensor's global size; None for a bytes item."""


class Directory(msgspec.Struct, frozen=True):
    """Every key of a checkpoint and where it is: what a loading rank reads first."""

    world: int
    """Rank files in the checkpoint."""
    keys: dict[str, Held]
    """Each key and where its items are."""
    planner_data: bytes
    """The metadata's ``planner_data`` (flattening mappings), pickled."""


def encode_directory(directory: Directory) -> bytes:
    """The directory file's content."""
    return msgspec.msgpack.encode(directory)


def decode_directory(data: bytes) -> Directory:
    """Read a directory file back."""
    return msgspec.msgpack.decode(data, type=Directory)


def rank_metadata(items: Sequence[WriteItem], results: Sequence[WriteResult]) -> bytes:
    """One rank file's part of the metadata, pickled: its chunks and storage data."""
    keys: dict[str, STORAGE_TYPES] = {}
    for item in items:
        if item.type == WriteItemType.BYTE_IO or item.tensor_data is None:
            keys[item.index.fqn] = BytesStorageMetadata()
            continue
        data = item.tensor_data
        entry = keys.setdefault(
            item.index.fqn, TensorStorageMetadata(data.properties, data.size, [])
        )
        assert isinstance(entry, TensorStorageMetadata)
        entry.chunks.append(data.chunk)
    storage = {result.index: result.storage_data for result in results}
    metadata = Metadata(state_dict_metadata=keys, storage_data=storage)
    return pickle.dumps(metadata, protocol=pickle.HIGHEST_PROTOCOL)


def directory_of(metadata: Metadata, results: Sequence[Sequence[WriteResult]]) -> Directory:
    """The directory of a checkpoint whose rank files hold ``results``."""
    holders: dict[str, list[tuple[int, int]]] = {}
    for rank, written in enumerate(results):
        for result in written:
            ranges = holders.setdefault(result.index.fqn, [])
            if ranges and ranges[-1][1] == rank:
                ranges[-1] = (ranges[-1][0], rank + 1)
            elif not ranges or ranges[-1][1] < rank:
                ranges.append((rank, rank + 1))
    keys = {
        fqn: Held(ranges, _size(metadata.state_dict_metadata[fqn]))
        for fqn, ranges in holders.items()
    }
    planner_data = pickle.dumps(metadata.planner_data, protocol=pickle.HIGHEST_PROTOCOL)
    return Directory(len(results), keys, planner_data)


def _size(entry: STORAGE_TYPES) -> list[int] | None:
    return list(entry.size) if isinstance(entry, TensorStorageMetadata) else None


def guess(held: Held, chunk: ChunkStorageMetadata | None, slack: int = 0) -> list[int]:
    """Rank files likely to hold chunks overlapping ``chunk`` (None: a bytes item).

    Ranks holding a sharded key are assumed to hold it in order along the
    dimension ``chunk`` is cut in, evenly: rank file k of n holds about
    ``[k*S/n, (k+1)*S/n)`` of that dimension's S. ``slack`` more on each
    side allow for uneven shards.
    """
    n = sum(end - first for first, end in held.ranks)
    dim = _cut(held, chunk)
    if held.size is None or chunk is None or dim is None or n == 1:
        return _ranks_at(held, 0, n)
    extent = held.size[dim]
    start, end = chunk.offsets[dim], chunk.offsets[dim] + chunk.sizes[dim]
    first = max(0, start * n // extent - slack)
    last = min(n, -(-end * n // extent) + slack)
    return _ranks_at(held, first, last)


def _ranks_at(held: Held, first: int, last: int) -> list[int]:
    """The ``first``-th to ``last``-th rank files holding a key, without listing them all."""
    found: list[int] = []
    skipped = 0
    for start, end in held.ranks:
        lo, hi = max(first - skipped, 0), min(last - skipped, end - start)
        found.extend(range(start + lo, start + hi))
        skipped += end - start
        if skipped >= last:
            break
    return found


def _cut(held: Held, chunk: ChunkStorageMetadata | None) -> int | None:
    """The first dimension in which ``chunk`` is a part of the tensor."""
    if held.size is None or chunk is None:
        return None
    for dim, (size, extent) in enumerate(zip(chunk.sizes, held.size, strict=True)):
        if size < extent:
            return dim
    return None


def rank_file_limit(world: int) -> int:
    """Rank files worth reading before the whole metadata is the cheaper read."""
    return max(8, world // 8)


def covers(saved: Iterable[ChunkStorageMetadata], wanted: ChunkStorageMetadata) -> bool:
    """Whether disjoint saved chunks cover all of ``wanted``."""
    volume = sum(_overlap(chunk, wanted) for chunk in saved)
    return volume == math.prod(wanted.sizes)


def _overlap(a: ChunkStorageMetadata, b: ChunkStorageMetadata) -> int:
    volume = 1
    for a_start, a_size, b_start, b_size in zip(
        a.offsets, a.sizes, b.offsets, b.sizes, strict=True
    ):
        volume *= max(0, min(a_start + a_size, b_start + b_size) - max(a_start, b_start))
    return volume


Wants = dict[str, list[ChunkStorageMetadata] | None]
"""What a loading rank needs: each key's local chunks (None for a bytes item)."""


class RankedMetadata:
    """A checkpoint's metadata read by rank file, as little as a loading rank needs.

    ``metadata`` is a stock ``Metadata`` whose ``state_dict_metadata`` and
    ``storage_data`` are read-only mappings filled on demand. A planner that
    calls ``want`` first (``GrabenLoadPlanner``) gets each key with the
    chunks overlapping its own; any other use reads the full metadata once.
    """

    def __init__(
        self,
        directory: Directory,
        read_rank: Callable[[int], Metadata],
        read_full: Callable[[], Metadata],
    ) -> None:
        self.directory = directory
        self._read_rank, self._read_full = read_rank, read_full
        self._ranks: dict[int, Metadata] = {}
        self._keys: dict[str, STORAGE_TYPES] = {}
        self._full: Metadata | None = None
        planner_data = pickle.loads(directory.planner_data)
        self.metadata = Metadata(
            state_dict_metadata=_Keys(self),  # type: ignore[arg-type]  # a read-only mapping
            planner_data=planner_data,
            storage_data=_Storage(self),
        )

    @property
    def rank_files_read(self) -> list[int]:
        """The rank files whose metadata this rank read."""
        return sorted(self._ranks)

    @property
    def read_full(self) -> bool:
        """Whether the full ``.metadata`` had to be read."""
        return self._full is not None

    def want(self, wants: Wants) -> None:
        """Read the rank files covering ``wants``; keys they do not cover come from the full.

        The proportional guess first; then, for keys it did not cover, the
        guess widened by ``GUESS_SLACK``.
        """
        missing = {
            fqn: chunks
            for fqn, chunks in wants.items()
            if fqn in self.directory.keys and fqn not in self._keys
        }
        for slack in (0, GUESS_SLACK):
            ranks = {
                r for fqn, chunks in missing.items() for r in self._guesses(fqn, chunks, slack)
            }
            if len(ranks | self._ranks.keys()) > rank_file_limit(self.directory.world):
                return  # the remaining keys come from the full metadata
            for rank in sorted(ranks):
                self._rank(rank)
            for fqn, chunks in list(missing.items()):
                entry = self._merged(fqn)
                if entry is not None and _enough(entry, chunks):
                    self._keys[fqn] = entry
                    del missing[fqn]
            if not missing:
                return

    def _guesses(self, fqn: str, chunks: list[ChunkStorageMetadata] | None, slack: int) -> set[int]:
        held = self.directory.keys[fqn]
        if chunks is None:
            return set(guess(held, None))
        return {rank for chunk in chunks for rank in guess(held, chunk, slack)}

    def _rank(self, rank: int) -> Metadata:
        if rank not in self._ranks:
            self._ranks[rank] = self._read_rank(rank)
        return self._ranks[rank]

    def _merged(self, fqn: str) -> STORAGE_TYPES | None:
        """``fqn`` as far as the rank files read so far describe it."""
        found = [
            m.state_dict_metadata[fqn] for m in self._ranks.values() if fqn in m.state_dict_metadata
        ]
        if not found or isinstance(found[0], BytesStorageMetadata):
            return found[0] if found else None
        chunks = [
            c for entry in found if isinstance(entry, TensorStorageMetadata) for c in entry.chunks
        ]
        first = found[0]
        return TensorStorageMetadata(first.properties, first.size, chunks)

    def key(self, fqn: str) -> STORAGE_TYPES:
        """Key ``fqn``: as ``want`` found it, else from the full metadata."""
        entry = self._keys.get(fqn)
        return entry if entry is not None else self.full().state_dict_metadata[fqn]

    def storage(self, index: MetadataIndex) -> Any:
        """Where item ``index`` lies, from the rank files read, else the full metadata."""
        for metadata in self._ranks.values():
            info = metadata.storage_data.get(index)
            if info is not None:
                return info
        return self.full().storage_data[index]

    def full(self) -> Metadata:
        """The whole ``.metadata``, read once."""
        if self._full is None:
            self._full = self._read_full()
        return self._full


def _enough(entry: STORAGE_TYPES, chunks: list[ChunkStorageMetadata] | None) -> bool:
    if isinstance(entry, BytesStorageMetadata) or chunks is None:
        return isinstance(entry, BytesStorageMetadata) and chunks is None
    return all(covers(entry.chunks, chunk) for chunk in chunks)


def ranked_of(metadata: Metadata) -> RankedMetadata | None:
    """The ``RankedMetadata`` behind ``metadata``, if it is one's."""
    keys = metadata.state_dict_metadata
    return keys.ranked if isinstance(keys, _Keys) else None


class _Keys(Mapping[str, STORAGE_TYPES]):
    """``state_dict_metadata`` of a ``RankedMetadata``: keys from its directory."""

    def __init__(self, ranked: RankedMetadata) -> None:
        self.ranked = ranked

    def __getitem__(self, fqn: str) -> STORAGE_TYPES:
        if fqn not in self.ranked.directory.keys:
            raise KeyError(fqn)
        return self.ranked.key(fqn)

    def __contains__(self, fqn: object) -> bool:
        return fqn in self.ranked.directory.keys

    def __iter__(self) -> Iterator[str]:
        return iter(self.ranked.directory.keys)

    def __len__(self) -> int:
        return len(self.ranked.directory.keys)


class _Storage(Mapping[MetadataIndex, Any]):
    """``storage_data`` of a ``RankedMetadata``: looked up one item at a time."""

    def __init__(self, ranked: RankedMetadata) -> None:
        self._ranked = ranked

    def __getitem__(self, index: MetadataIndex) -> Any:
        return self._ranked.storage(index)

    def __iter__(self) -> Iterator[MetadataIndex]:
        return iter(self._ranked.full().storage_data)

    def __len__(self) -> int:
        return len(self._ranked.full().storage_data)
