"""``GrabenWriter`` / ``GrabenReader``: DCP storage on a graben store.

Save (DCP calls, in order: ``reset``, ``set_up_storage_writer``,
``prepare_local_plan``, ``prepare_global_plan`` on the coordinator,
``write_data`` on every rank, ``finish`` on the coordinator):

- the coordinator names one staging directory beside the checkpoint
  (``.NAME.saving-ID``) and hands it to every rank with its plan, with the
  digest of that rank's write results it still holds from the last save;
- each rank writes its items into one file there, tensors straight from
  their memory, plus an index (where each tensor's bytes start, crc32c) and
  its part of the metadata (``_ranked``); it sends the coordinator its
  results, or only their digest when the coordinator holds them;
- ``finish`` writes ``.metadata`` (the last save's bytes when nothing
  changed) and the directory of keys into the staging directory and renames
  it onto the checkpoint in one transaction. Until then nothing is visible;
  a crash leaves the previous checkpoint as it was, and an overwrite
  replaces the old tree in the same transaction.

Load reads the directory and, as planning asks (``GrabenLoadPlanner``), the
metadata of the rank files it needs, else ``.metadata`` whole; then for each
item only the bytes it needs: a tensor whose saved chunk matches the target
is read straight into the target's memory; a resharded one reads just the
rows that overlap.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import pickle
import posixpath
import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import crc32c
import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from graben.store import Client, IntegrityError, NotFound, connect, split_url

from ._format import (
    INDEX_DIR,
    ZSTD,
    FileIndex,
    ItemIndex,
    Record,
    bytes_record,
    compressed,
    decode_index,
    decompressed,
    encode_index,
    tensor_bytes,
    tensor_record,
)
from ._ranked import (
    DIRECTORY,
    RankedMetadata,
    decode_directory,
    directory_of,
    encode_directory,
    rank_metadata,
    rank_metadata_name,
)

METADATA = ".metadata"
SUFFIX = ".distcp"


@dataclass(frozen=True, slots=True)
class _Target:
    """What the coordinator tells each rank about where to write."""

    staging: str
    """The staging directory, renamed onto the checkpoint by ``finish``."""
    rank: int
    """The number of this rank's file."""
    known: bytes
    """Digest of this rank's write results as the coordinator holds them (b"" if none)."""

    @property
    def file(self) -> str:
        """This rank's file name inside the staging directory."""
        return f"__{self.rank}_0{SUFFIX}"


class _Results(list[WriteResult]):
    """A rank's write results; empty when the coordinator already holds them."""

    digest: bytes
    """Names the results (whether sent or not)."""
    unchanged: bool
    """Whether they were left out because the coordinator holds them."""


def _results(results: list[WriteResult], metadata: bytes, known: bytes) -> _Results:
    """``results`` to send the coordinator; ``metadata``, the rank's, holds all they say."""
    digest = hashlib.blake2b(metadata, digest_size=16).digest()
    unchanged = digest == known
    sent = _Results([] if unchanged else results)
    sent.digest, sent.unchanged = digest, unchanged
    return sent


@dataclass(frozen=True, slots=True)
class _LastSave:
    """What a coordinator keeps of its last save, so the next one can reuse it."""

    digests: list[bytes]
    """Each rank's results digest."""
    results: list[list[WriteResult]]
    """Each rank's results."""
    keys: object
    """The ``state_dict_metadata`` the files below were made from (compared by identity)."""
    metadata: bytes
    """The pickled ``.metadata``."""
    directory: bytes
    """The encoded ``.graben/directory``."""


_last_saves: dict[tuple[str | None, int], _LastSave] = {}
_written: set[tuple[str, int]] = set()
"""(staging, rank) this process wrote: a plan naming one again is stale."""


def _store_and_path(checkpoint_id: str | os.PathLike[str]) -> tuple[str | None, str]:
    store, path = split_url(os.fspath(checkpoint_id))
    if path in ("", "/"):
        raise ValueError(f"a checkpoint needs a directory below the root, not {checkpoint_id!r}")
    return store, path.rstrip("/")


_shared_clients: dict[tuple[object, ...], Client] = {}
_shared_lock = threading.Lock()


def _shared_client(store: str | None) -> Client:
    """One client per store per process, for every writer and reader without one.

    A job saving each step with ``GrabenWriter(url)`` would otherwise open a
    client (threads, connections, buffers) per step, pay for it in the save
    and never close it. The default store's key includes the environment
    that names it; a forked child makes its own.
    """
    key = (os.getpid(), store, os.environ.get("GRABEN_URL"), os.environ.get("GRABEN_HOME"))
    with _shared_lock:
        client = _shared_clients.get(key)
        if client is None:
            client = _shared_clients[key] = connect(store)
        return client


class _OnStore:
    """A checkpoint URL and the client for the store it names (shared unless one is given)."""

    def __init__(self, checkpoint_id: str | os.PathLike[str], client: Client | None) -> None:
        self._client = client
        self._store: str | None = None
        self._url, self.path = "", ""
        self._repoint(checkpoint_id)

    def _repoint(self, checkpoint_id: str | os.PathLike[str] | None) -> None:
        if not checkpoint_id:
            return
        self._store, self.path = _store_and_path(checkpoint_id)
        self._url = os.fspath(checkpoint_id)

    @property
    def checkpoint_id(self) -> str:
        """The checkpoint's URL."""
        return self._url

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        """Whether DCP should pick this class for ``checkpoint_id``: a ``graben:`` URL."""
        return os.fspath(checkpoint_id).startswith("graben:")

    @property
    def client(self) -> Client:
        """The client given, else the process's shared one for this store."""
        return self._client if self._client is not None else _shared_client(self._store)


class GrabenWriter(_OnStore, StorageWriter):
    """DCP ``StorageWriter`` into a graben store; atomic, checksummed, incremental.

    ``GrabenWriter("graben://host:port/ckpt/step-100")`` (or ``graben:///...``
    for the default store; ``client=`` to reuse an open ``Client``). Pass it
    as ``storage_writer`` to ``dcp.save`` or ``dcp.async_save``. Tensors that
    did not change since a previous checkpoint in the same store are not
    uploaded again. ``overwrite=False`` refuses to replace a checkpoint.
    ``compression=LEVEL`` compresses each item with zstd at that level (DCP's
    own ``stream.zstd`` transform, so its readers read it too); compressed
    tensors no longer dedup or load in place.
    """

    def __init__(
        self,
        checkpoint_id: str | os.PathLike[str],
        *,
        client: Client | None = None,
        overwrite: bool = True,
        replication: int | None = None,
        compression: int | None = None,
    ) -> None:
        super().__init__(checkpoint_id, client)
        self.compression = compression
        self.overwrite, self.replication = overwrite, replication
        self.save_id = uuid.uuid4().hex
        self.is_coordinator = False
        self._staging = ""  # named by the coordinator in prepare_global_plan
        self._last: _LastSave | None = None  # what the coordinator told ranks it holds

    # docstring inherited
    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self._repoint(checkpoint_id)
        self.save_id = uuid.uuid4().hex

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self._url, save_id=self.save_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        if self.is_coordinator and not self.overwrite and self.client.exists(self.path):
            raise FileExistsError(f"checkpoint {self._url} exists and overwrite=False")
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        parent, name = posixpath.split(self.path)
        staging = self._staging = posixpath.join(parent, f".{name}.saving-{self.save_id}")
        last = self._last = _last_saves.get((self._store, len(plans)))
        return [
            dataclasses.replace(
                plan, storage_data=_Target(staging, i, last.digests[i] if last else b"")
            )
            for i, plan in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        target: _Target = plan.storage_data
        if (target.staging, target.rank) in _written:
            raise ValueError(
                "GrabenWriter was handed a stale plan (a planner cached the storage part "
                "of its plan); use GrabenSavePlanner for plan caching"
            )
        _written.add((target.staging, target.rank))
        results = self._write_file(plan, planner, target)
        metadata = rank_metadata(plan.items, results)
        self.client.put(
            posixpath.join(target.staging, rank_metadata_name(target.rank)),
            metadata,
            replication=self.replication,
        )
        done: Future[list[WriteResult]] = Future()
        done.set_result(_results(results, metadata, target.known))
        return done

    def _write_file(
        self, plan: SavePlan, planner: SavePlanner, target: _Target
    ) -> list[WriteResult]:
        """Write this rank's items into its file and its index; their results."""
        records = [(item, self._record(item, planner.resolve_data(item))) for item in plan.items]
        results, firsts, position = [], [], 0
        parts: list[memoryview | bytes] = []
        transforms = [ZSTD] if self.compression is not None else None
        for item, record in records:
            results.append(_result(item, target.file, position, record, transforms))
            firsts.append(len(parts))
            parts.extend(record.parts)
            position += record.length
        client = self.client
        # each part's crc32c comes from the store's chunk checksums: no pass of our own
        _, sums = client.put_parts_checked(
            posixpath.join(target.staging, target.file), parts, replication=self.replication
        )
        index = {}
        for (_, record), first, result in zip(records, firsts, results, strict=True):
            checksum = sums[first + record.data_part] if record.data_part >= 0 else 0
            at = result.storage_data.offset
            index[at] = _index_entry(at, record, checksum)
        client.put(
            posixpath.join(target.staging, INDEX_DIR, target.file),
            encode_index(index),
            replication=self.replication,
        )
        return results

    def _record(self, item: WriteItem, data: Any) -> Record:
        record = bytes_record(data) if item.type == WriteItemType.BYTE_IO else tensor_record(data)
        return record if self.compression is None else compressed(record, self.compression)

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        last = self._reuse(metadata, results)
        _last_saves[(self._store, len(results))] = last
        metadata.storage_meta = self.storage_meta()
        staging, client = self._staging, self.client
        client.put(posixpath.join(staging, METADATA), last.metadata, replication=self.replication)
        client.put(posixpath.join(staging, DIRECTORY), last.directory, replication=self.replication)
        client.rename(staging, self.path, replace=self.overwrite, replace_tree=True)

    def _reuse(self, metadata: Metadata, results: list[list[WriteResult]]) -> _LastSave:
        """This save's metadata files: the last save's when nothing changed."""
        last, full, digests = self._last, [], []
        for rank, sent in enumerate(results):
            assert isinstance(sent, _Results), "write_data makes every rank's results"
            if sent.unchanged:  # only when it matched what prepare_global_plan sent it
                assert last is not None
                full.append(last.results[rank])
            else:
                full.append(list(sent))
            digests.append(sent.digest)
        keys = metadata.state_dict_metadata
        if last is not None and last.keys is keys and last.digests == digests:
            return last
        metadata.storage_data = {r.index: r.storage_data for rank in full for r in rank}
        data = pickle.dumps(
            dataclasses.replace(metadata, storage_meta=None), protocol=pickle.HIGHEST_PROTOCOL
        )
        directory = encode_directory(directory_of(metadata, full))
        return _LastSave(digests, full, keys, data, directory)


def _result(
    item: WriteItem, file: str, position: int, record: Record, transforms: list[str] | None
) -> WriteResult:
    info = _StorageInfo(file, position, record.length, transforms)
    return WriteResult(index=item.index, size_in_bytes=record.length, storage_data=info)


def _index_entry(position: int, record: Record, checksum: int) -> ItemIndex:
    data_offset = position + record.data_start if record.data_start >= 0 else -1
    return ItemIndex(position, record.length, data_offset, record.data.nbytes, checksum)


def _crc32c(data: memoryview) -> int:
    """crc32c of ``data``, without the GIL for large buffers (the library keeps it by default)."""
    value: int = crc32c.crc32c(data, gil_release_mode=1 if data.nbytes >= 1 << 16 else 0)
    return value


class GrabenReader(_OnStore, StorageReader):
    """DCP ``StorageReader`` from a graben store: reads only the bytes each rank needs.

    ``GrabenReader("graben://host:port/ckpt/step-100")``; pass it as
    ``storage_reader`` to ``dcp.load``. Reads checkpoints written by
    ``GrabenWriter`` and by DCP's own fsspec writer on ``graben://``.
    """

    def __init__(self, checkpoint_id: str | os.PathLike[str], *, client: Client | None = None):
        super().__init__(checkpoint_id, client)
        self._metadata: Metadata | None = None
        self._indexes: dict[str, FileIndex | None] = {}
        self.ranked: RankedMetadata | None = None
        """How the last ``read_metadata`` was read by rank (None when read whole)."""

    # docstring inherited
    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self._repoint(checkpoint_id)
        self._metadata = self.ranked = None
        self._indexes.clear()

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The checkpoint's metadata, read by rank file as planning asks for it.

        A checkpoint without graben's directory (DCP's own writers) is read
        whole from ``.metadata``.
        """
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
                saved = _saved(self._metadata, item.storage_index)
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


def _saved(metadata: Metadata, index: MetadataIndex) -> _Saved:
    entry = metadata.state_dict_metadata[index.fqn]
    assert isinstance(entry, TensorStorageMetadata)
    for chunk in entry.chunks:
        if tuple(chunk.offsets) == tuple(index.offset or ()):
            return _Saved(list(chunk.sizes), entry.properties.dtype)
    raise KeyError(f"no saved chunk of {index.fqn} at {index.offset}")


def _read_at(stream: io.BufferedReader, offset: int, length: int) -> bytes:
    stream.seek(offset)
    data = stream.read(length)
    if len(data) != length:
        raise IntegrityError(f"checkpoint file ends early: wanted {length} bytes at {offset}")
    return data


def _record_bytes(stream: io.BufferedReader, info: _StorageInfo) -> bytes:
    """An item's record, decompressed if it was written compressed."""
    data = _read_at(stream, info.offset, info.length)
    transforms = tuple(info.transform_descriptors or ())
    if transforms == (ZSTD,):
        return decompressed(data)
    if transforms:
        raise ValueError(f"checkpoint item stored with unknown transforms {transforms}")
    return data


def _readinto_at(stream: io.BufferedReader, offset: int, into: memoryview) -> None:
    stream.seek(offset)
    done = 0
    while done < into.nbytes:
        n = stream.readinto(into[done:])
        if not n:
            raise IntegrityError(f"checkpoint file ends early at {offset + done}")
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
            _check(view, entry)
        return
    block = torch.empty([rows, *sizes[1:]], dtype=saved.dtype)
    _readinto_at(stream, entry.data_offset + first * row_bytes, tensor_bytes(block))
    for dim, (start, length) in enumerate(_inner(item), start=1):
        block = block.narrow(dim, start, length)
    target.copy_(block)


def _inner(item: ReadItem) -> Iterator[tuple[int, int]]:
    yield from zip(item.storage_offsets[1:], item.lengths[1:], strict=True)


def _check(data: memoryview, entry: ItemIndex) -> None:
    if _crc32c(data) != entry.crc32c:
        raise IntegrityError(
            f"checkpoint item at offset {entry.offset} fails its crc32c: the file is damaged"
        )
