"""``GrabenWriter``: DCP saves into a graben store (the protocol: ``_storage``)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pickle
import posixpath
import uuid
from dataclasses import dataclass
from typing import Any

from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

from graben.store import (
    AlreadyExists,
    AsyncClient,
    Client,
    FileCommit,
    InvalidArgument,
    Upload,
    WriteOptions,
)

from ._format import (
    INDEX_DIR,
    ZSTD,
    ItemIndex,
    Record,
    bytes_record,
    compressed,
    encode_index,
    tensor_record,
)
from ._ranked import DIRECTORY, directory_of, encode_directory, rank_metadata, rank_metadata_name
from ._storage import METADATA, SUFFIX, OnStore


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
        return _rank_file(self.rank)


def _rank_file(rank: int) -> str:
    """Rank file ``rank``'s name inside the staging directory (and the checkpoint)."""
    return f"__{rank}_0{SUFFIX}"


class _Results(list[WriteResult]):
    """A rank's write results (empty when the coordinator already holds them), and its
    files, finished and not committed: the coordinator commits every rank's at once."""

    digest: bytes
    """Names the results (whether sent or not)."""
    unchanged: bool
    """Whether they were left out because the coordinator holds them."""
    files: list[FileCommit]
    """The rank's file, its index and its metadata, for the coordinator to commit."""


def _results(
    results: list[WriteResult], metadata: bytes, known: bytes, files: list[FileCommit]
) -> _Results:
    """``results`` to send the coordinator; ``metadata``, the rank's, holds all they say."""
    digest = hashlib.blake2b(metadata, digest_size=16).digest()
    unchanged = digest == known
    sent = _Results([] if unchanged else results)
    sent.digest, sent.unchanged, sent.files = digest, unchanged, files
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
    store: str | None
    """The store it was saved to (``None``: the default one)."""


class GrabenWriter(OnStore, StorageWriter):
    """DCP ``StorageWriter`` into a graben store; atomic, checksummed, incremental.

    ``GrabenWriter("graben://host:port/ckpt/step-100")`` (or ``graben:///...``
    for the default store; ``client=`` to reuse an open ``Client``). Pass it
    as ``storage_writer`` to ``dcp.save`` or ``dcp.async_save``. Tensors that
    did not change since a previous checkpoint in the same store are not
    uploaded again. ``overwrite=False`` refuses to replace a checkpoint.
    ``compression=LEVEL`` compresses each item with zstd at that level (DCP's
    own ``stream.zstd`` transform, so its readers read it too); compressed
    tensors no longer dedup or load in place.

    Reuse one writer for each step's save (``dcp.save(..., checkpoint_id=url,
    storage_writer=writer)`` resets it; ``CheckpointManager`` does): it keeps
    the last save's metadata, and ranks whose items did not change send the
    coordinator a digest instead of their write results.
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
        self._last: _LastSave | None = None  # the coordinator's last save, to reuse

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
            raise AlreadyExists("checkpoint exists and overwrite=False", self._url)
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        parent, name = posixpath.split(self.path)
        staging = self._staging = posixpath.join(parent, f".{name}.saving-{self.save_id}")
        last = self._last
        if last is not None and (last.store != self._store or len(last.digests) != len(plans)):
            last = self._last = None  # another store or world size: nothing to reuse
        return [
            dataclasses.replace(
                plan, storage_data=_Target(staging, i, last.digests[i] if last else b"")
            )
            for i, plan in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        target: _Target = plan.storage_data
        if self._stale(target.staging):
            raise InvalidArgument(
                "GrabenWriter was handed a stale plan (a planner cached the storage part "
                "of its plan); use GrabenSavePlanner for plan caching",
                self.path,
            )
        results, metadata, files = self._write_rank(plan, planner, target)
        done: Future[list[WriteResult]] = Future()
        done.set_result(_results(results, metadata, target.known, files))
        return done

    def _stale(self, staging: str) -> bool:
        """Whether ``staging`` is not this save's: another checkpoint's, or (on the
        coordinator, which named it for this save alone) not the one it named."""
        if self.is_coordinator and staging != self._staging:
            return True
        parent, name = posixpath.split(self.path)
        return not staging.startswith(posixpath.join(parent, f".{name}.saving-"))

    def _write_rank(
        self, plan: SavePlan, planner: SavePlanner, target: _Target
    ) -> tuple[list[WriteResult], bytes, list[FileCommit]]:
        """Write this rank's file, its index and its metadata, uncommitted (the small two
        ride in the coordinator's commit: the engine keeps them); their results, the
        metadata and the files for the coordinator to commit."""
        records = [(item, self._record(item, planner.resolve_data(item))) for item in plan.items]
        results, firsts, position = [], [], 0
        parts: list[memoryview | bytes] = []
        transforms = [ZSTD] if self.compression is not None else None
        for item, record in records:
            results.append(_result(item, target.file, position, record, transforms))
            firsts.append(len(parts))
            parts.extend(record.parts)
            position += record.length
        metadata = rank_metadata(plan.items, results)
        join, copies = posixpath.join, self.replication

        async def save(aio: AsyncClient) -> list[FileCommit]:
            # each part's crc32c comes from the store's chunk checksums: no pass of our own
            write = WriteOptions(replication=copies)
            data, sums = await aio.stage_parts(
                join(target.staging, target.file), parts, write=write
            )
            index = {}
            for (_, record), first, result in zip(records, firsts, results, strict=True):
                checksum = sums[first + record.data_part] if record.data_part >= 0 else 0
                at = result.storage_data.offset
                index[at] = _index_entry(at, record, checksum)
            small = {
                join(target.staging, INDEX_DIR, target.file): encode_index(index),
                join(target.staging, rank_metadata_name(target.rank)): metadata,
            }
            return await aio.finish_uploads([data, *await _staged(aio, small, copies)])

        return results, metadata, self.client.submit(save).result()

    def _record(self, item: WriteItem, data: Any) -> Record:
        record = bytes_record(data) if item.type == WriteItemType.BYTE_IO else tensor_record(data)
        return record if self.compression is None else compressed(record, self.compression)

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        last = self._last = self._reuse(metadata, results)
        metadata.storage_meta = self.storage_meta()
        staging, copies = self._staging, self.replication
        ranks = _ranks_files(staging, results)
        files = {
            posixpath.join(staging, METADATA): last.metadata,
            posixpath.join(staging, DIRECTORY): last.directory,
        }

        async def publish(aio: AsyncClient) -> None:
            mine = await _staged(aio, files, copies)
            await aio.publish(
                mine, staging, self.path, replace=self.overwrite, replace_tree=True, files=ranks
            )

        self.client.submit(publish).result()

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
        return _LastSave(digests, full, keys, data, directory, self._store)


def _ranks_files(staging: str, results: list[list[WriteResult]]) -> list[FileCommit]:
    """Every rank's files, each checked to be one a rank of this save writes (a rank
    cannot have the coordinator commit anything else)."""
    files = []
    for rank, sent in enumerate(results):
        assert isinstance(sent, _Results), "write_data makes every rank's results"
        name = _rank_file(rank)
        allowed = {
            posixpath.join(staging, name),
            posixpath.join(staging, INDEX_DIR, name),
            posixpath.join(staging, rank_metadata_name(rank)),
        }
        for file in sent.files:
            if file.path not in allowed:
                raise InvalidArgument(f"rank {rank} sent a file outside its own", file.path)
        files.extend(sent.files)
    return files


async def _staged(aio: AsyncClient, files: dict[str, bytes], copies: int | None) -> list[Upload]:
    """Uploads of small files, finished and not yet committed."""
    write = WriteOptions(replication=copies)
    return [(await aio.stage_parts(path, [data], write=write))[0] for path, data in files.items()]


def _result(
    item: WriteItem, file: str, position: int, record: Record, transforms: list[str] | None
) -> WriteResult:
    info = _StorageInfo(file, position, record.length, transforms)
    return WriteResult(index=item.index, size_in_bytes=record.length, storage_data=info)


def _index_entry(position: int, record: Record, checksum: int) -> ItemIndex:
    data_offset = position + record.data_start if record.data_start >= 0 else -1
    return ItemIndex(position, record.length, data_offset, record.data.nbytes, checksum)
