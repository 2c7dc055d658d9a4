"""``GrabenReader``: DCP loads from a graben store (the protocol: ``_storage``)."""

from __future__ import annotations

import io
import os
import pickle
import posixpath
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import crc32c
import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from graben.store import Client, IntegrityError, InvalidArgument, NotFound

from ._format import INDEX_DIR, ZSTD, FileIndex, ItemIndex, decode_index, decompressed, tensor_bytes
from ._ranked import DIRECTORY, RankedMetadata, decode_directory, rank_metadata_name
from ._storage import METADATA, OnStore


def _crc32c(data: memoryview) -> int:
    """crc32c of ``data``, without the GIL for large buffers (the library keeps it by default)."""
    value: int = crc32c.crc32c(data, gil_release_mode=1 if data.nbytes >= 1 << 16 else 0)
    return value


class GrabenReader(OnStore, StorageReader):
    """DCP ``StorageReader`` from a graben store: reads only the bytes each rank needs.

    ``GrabenReader("graben://host:port/ckpt/step-100")``; pass it as
    ``storage_reader`` to ``dcp.load``. Reads checkpoints written by
    ``GrabenWriter`` and by DCP's own fsspec writer on ``graben://``.
    """

    def __init__(self, checkpoint_id: str | os.PathLike[str], *, client: Client | None = None):
        super().__init__(checkpoint_id, client)
        self._metadata: Metadata | None = None
        self._read: Metadata | None = None
        """``read_metadata``'s, kept until ``reset``."""
        self._indexes: dict[str, FileIndex | None] = {}
        self.ranked: RankedMetadata | None = None
        """How the last ``read_metadata`` was read by rank (None when read whole)."""

    # docstring inherited
    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self._repoint(checkpoint_id)
        self._metadata = self._read = self.ranked = None
        self._indexes.clear()

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The checkpoint's metadata, read by rank file as planning asks for it; read once
        until ``reset``, as the files' indexes are (the checkpoint manager reads it
        before ``dcp.load`` does, to check the state dict against it).

        A checkpoint without graben's directory (DCP's own writers) is read
        whole from ``.metadata``.
        """
        if self._read is None:
            self._read = self._read_metadata()
        return self._read

    def _read_metadata(self) -> Metadata:
        try:
            directory = decode_directory(self.client.get(posixpath.join(self.path, DIRECTORY)))
        except NotFound:
            return self._read_pickled(METADATA)
        self.ranked = RankedMetadata(
            directory,
            lambda rank: self._read_pickled(rank_metadata_name(rank)),
            partial(self._read_pickled, METADATA),
        )
        return self.ranked.metadata

    def _read_pickled(self, name: str) -> Metadata:
        metadata: Metadata = pickle.loads(self.client.get(posixpath.join(self.path, name)))
        return metadata

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        self._metadata = metadata

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        assert self._metadata is not None, "set_up_storage_reader comes first"
        for file, items in _by_file(plan.items, self._metadata.storage_data).items():
            self._read_file(file, items, planner)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _read_file(self, file: str, items: list[ReadItem], planner: LoadPlanner) -> None:
        assert self._metadata is not None
        index = self._index(file)
        with self.client.open(posixpath.join(self.path, file)) as stream:
            for item in sorted(items, key=lambda i: self._info(i).offset):
                info = self._info(item)
                entry = index.get(info.offset) if index is not None else None
                if item.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(item, io.BytesIO(_record_bytes(stream, info)))
                    continue
                target = planner.resolve_tensor(item).detach()
                saved = _saved(self._metadata, item.storage_index, stream.name)
                if entry is None or entry.data_offset < 0:
                    _load_record(stream, info, item, target)
                else:
                    _load_raw(stream, entry, saved, item, target)
                planner.commit_tensor(item, target)

    def _info(self, item: ReadItem) -> _StorageInfo:
        assert self._metadata is not None
        info: _StorageInfo = self._metadata.storage_data[item.storage_index]
        return info

    def _index(self, file: str) -> FileIndex | None:
        if file not in self._indexes:
            path = posixpath.join(self.path, INDEX_DIR, file)
            client = self.client
            self._indexes[file] = decode_index(client.get(path)) if client.exists(path) else None
        return self._indexes[file]


def _by_file(items: Sequence[ReadItem], storage: Any) -> dict[str, list[ReadItem]]:
    files: dict[str, list[ReadItem]] = {}
    for item in items:
        files.setdefault(storage[item.storage_index].relative_path, []).append(item)
    return files


@dataclass(frozen=True, slots=True)
class _Saved:
    """A saved tensor chunk's shape and type."""

    sizes: list[int]
    """Its size in each dimension."""
    dtype: torch.dtype
    """Its element type."""


def _saved(metadata: Metadata, index: MetadataIndex, path: str) -> _Saved:
    entry = metadata.state_dict_metadata[index.fqn]
    assert isinstance(entry, TensorStorageMetadata)
    for chunk in entry.chunks:
        if tuple(chunk.offsets) == tuple(index.offset or ()):
            return _Saved(list(chunk.sizes), entry.properties.dtype)
    raise IntegrityError(f"no saved chunk of {index.fqn} at {index.offset}", path)


def _read_at(stream: io.BufferedReader, offset: int, length: int) -> bytes:
    stream.seek(offset)
    data = stream.read(length)
    if len(data) != length:
        raise IntegrityError(
            f"checkpoint file ends early: wanted {length} bytes at {offset}", stream.name
        )
    return data


def _record_bytes(stream: io.BufferedReader, info: _StorageInfo) -> bytes:
    """An item's record, decompressed if it was written compressed."""
    data = _read_at(stream, info.offset, info.length)
    transforms = tuple(info.transform_descriptors or ())
    if transforms == (ZSTD,):
        return decompressed(data)
    if transforms:
        raise InvalidArgument(
            f"checkpoint item stored with unknown transforms {transforms}", stream.name
        )
    return data


def _readinto_at(stream: io.BufferedReader, offset: int, into: memoryview) -> None:
    stream.seek(offset)
    done = 0
    while done < into.nbytes:
        n = stream.readinto(into[done:])
        if not n:
            raise IntegrityError(f"checkpoint file ends early at {offset + done}", stream.name)
        done += n


def _load_record(
    stream: io.BufferedReader, info: _StorageInfo, item: ReadItem, target: torch.Tensor
) -> None:
    """A record without raw data to read in place: ``torch.load`` it whole."""
    record = io.BytesIO(_record_bytes(stream, info))
    tensor = torch.load(record, map_location="cpu", weights_only=True)
    for dim, (start, length) in enumerate(zip(item.storage_offsets, item.lengths, strict=True)):
        tensor = tensor.narrow(dim, start, length)
    target.copy_(tensor)


def _load_raw(
    stream: io.BufferedReader,
    entry: ItemIndex,
    saved: _Saved,
    item: ReadItem,
    target: torch.Tensor,
) -> None:
    """Read only the saved rows the item needs; straight into ``target`` when they are it."""
    sizes = saved.sizes
    if target.numel() == 0:
        return
    row_bytes = entry.data_length // sizes[0] if sizes and sizes[0] else entry.data_length
    first, rows = (item.storage_offsets[0], item.lengths[0]) if sizes else (0, 1)
    whole_rows = list(item.lengths[1:]) == sizes[1:]
    if whole_rows and target.is_contiguous() and target.dtype == saved.dtype:
        view = tensor_bytes(target)
        _readinto_at(stream, entry.data_offset + first * row_bytes, view)
        if rows == (sizes[0] if sizes else 1):
            _check(view, entry, stream.name)
        return
    block = torch.empty([rows, *sizes[1:]], dtype=saved.dtype)
    _readinto_at(stream, entry.data_offset + first * row_bytes, tensor_bytes(block))
    for dim, (start, length) in enumerate(_inner(item), start=1):
        block = block.narrow(dim, start, length)
    target.copy_(block)


def _inner(item: ReadItem) -> Iterator[tuple[int, int]]:
    yield from zip(item.storage_offsets[1:], item.lengths[1:], strict=True)


def _check(data: memoryview, entry: ItemIndex, path: str) -> None:
    if _crc32c(data) != entry.crc32c:
        raise IntegrityError(
            f"checkpoint item at offset {entry.offset} fails its crc32c: the file is damaged", path
        )
