"""What a rank's ``.distcp`` file holds, byte for byte: DCP's own format.

Each item is stored as DCP's ``FileSystemWriter`` stores it (a tensor as one
``torch.save`` record, bytes as they are), so DCP's own readers and tools
read graben checkpoints. Two things are added on the side, in an index file
per rank: where each tensor's raw bytes start inside its record (so a
resharded load reads only the rows it needs, straight into the tensor), and
a crc32c of those bytes.

``torch.save`` hands its writer a view of the tensor's own memory for the
data; ``tensor_record`` keeps that view instead of copying it, so the upload
reads the tensor in place.
"""

from __future__ import annotations

import io
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import torch

from graben.store import InvalidArgument

INDEX_DIR = ".graben"
"""Directory of a checkpoint holding each rank file's index."""


class ItemIndex(msgspec.Struct, frozen=True, array_like=True):
    """Where an item's bytes lie in its rank file."""

    offset: int
    """Start of the item's record in the file (DCP's ``_StorageInfo.offset``)."""
    length: int
    """Bytes in the record."""
    data_offset: int
    """Start of a tensor's raw bytes in the file; -1 for a bytes item."""
    data_length: int
    """Bytes of raw tensor data (the whole record for a bytes item)."""
    crc32c: int
    """crc32c of the raw tensor data (of the whole record for a bytes item)."""


FileIndex = dict[int, ItemIndex]
"""A rank file's items by record offset."""


def encode_index(index: FileIndex) -> bytes:
    """The index file's content."""
    return msgspec.msgpack.encode(index)


def decode_index(data: bytes) -> FileIndex:
    """Read an index file back."""
    return msgspec.msgpack.decode(data, type=FileIndex)


@dataclass(frozen=True, slots=True)
class Record:
    """One item, serialized: the buffers to store in order, and where its data starts."""

    parts: list[memoryview | bytes]
    """The record's bytes, in order; large ones are views of the tensor itself."""
    data_start: int
    """Offset of the raw tensor data inside the record; -1 for bytes items."""
    data: memoryview
    """The raw data (a view of the tensor, or of the bytes item)."""
    data_part: int
    """Which of ``parts`` is ``data``; -1 when it is empty."""

    @property
    def length(self) -> int:
        """Bytes in the record."""
        return sum(memoryview(p).nbytes for p in self.parts)


def owned(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU tensor that is exactly its storage: contiguous, from offset 0.

    ``torch.save`` writes a tensor's whole storage, so a view into a larger
    one would save (and upload) all of it.
    """
    tensor = tensor.detach().cpu()
    storage = tensor.untyped_storage()
    exact = tensor.storage_offset() == 0 and storage.nbytes() == tensor.nbytes
    if tensor.is_contiguous() and exact:
        return tensor
    return tensor.clone(memory_format=torch.contiguous_format)


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The raw bytes of a contiguous CPU tensor, without a copy."""
    if tensor.nbytes == 0:
        return memoryview(b"")
    flat = tensor.reshape(-1).view(torch.uint8)
    array: Any = flat.numpy()
    return memoryview(array).cast("B")


def tensor_record(tensor: torch.Tensor) -> Record:
    """``torch.save(tensor)`` as buffers, its data a view of ``tensor`` (keep it alive).

    Without the zip's own crc32 of the data (``torch.load`` does not check
    it; the index keeps a crc32c): it was a full pass over every tensor at
    ~4 GB/s, a tenth of a save's time.
    """
    tensor = owned(tensor)
    capture = _Capture(tensor)
    with _without_zip_crc():
        torch.save(tensor, capture)  # type: ignore[arg-type]  # any writable binary stream
    if capture.data_start < 0:  # an empty tensor has no data record
        return Record(capture.parts, -1, memoryview(b""), -1)
    return Record(capture.parts, capture.data_start, tensor_bytes(tensor), capture.data_part)


def _without_zip_crc() -> AbstractContextManager[object]:
    try:
        from torch.utils.serialization import config
    except ImportError:  # torch before the option
        return nullcontext()
    patch: AbstractContextManager[object] = config.patch(  # type: ignore[attr-defined]
        {"save.compute_crc32": False}
    )
    return patch


ZSTD = "stream.zstd/1"
"""DCP's descriptor of its ZStandard stream transform: its own readers undo it."""


def compressed(record: Record, level: int) -> Record:
    """``record`` as one zstd frame (DCP's ``stream.zstd`` transform).

    Compressed items have no raw data to read in place: loads read and
    decompress the whole record.
    """
    zstandard = _zstandard()
    frame = zstandard.ZstdCompressor(level=level, threads=-1).compress(b"".join(record.parts))
    return Record([frame], -1, memoryview(frame), 0)


def decompressed(frame: bytes) -> bytes:
    """The record inside a zstd frame written by ``compressed``."""
    record: bytes = _zstandard().ZstdDecompressor().decompress(frame)
    return record


def _zstandard() -> Any:
    try:
        import zstandard
    except ImportError:
        raise InvalidArgument(
            "zstd checkpoints need the zstandard package: pip install zstandard"
        ) from None
    return zstandard


def bytes_record(data: io.BytesIO) -> Record:
    """A bytes item: stored as it is."""
    value = data.getvalue()
    return Record([value], -1, memoryview(value), 0)


class _Capture(io.RawIOBase):
    """A write-only stream for ``torch.save`` that keeps the tensor's data by reference.

    ``torch.save`` passes views of short-lived buffers for its headers (copied
    here) and a view of the storage itself for the data (kept).
    """

    def __init__(self, tensor: torch.Tensor) -> None:
        super().__init__()
        self.parts: list[memoryview | bytes] = []
        self.position = 0
        self.data_start = -1
        self.data_part = -1
        self._tensor = tensor
        self._address = tensor.untyped_storage().data_ptr()
        self._size = tensor.untyped_storage().nbytes()

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(data).cast("B")
        size = view.nbytes
        if self.data_start < 0 and size == self._size and size and self._is_storage(view):
            self.data_start = self.position
            self.data_part = len(self.parts)
            self.parts.append(tensor_bytes(self._tensor))
        else:
            self.parts.append(bytes(view))
        self.position += size
        return size

    def _is_storage(self, view: memoryview) -> bool:
        address: int = np.frombuffer(view, dtype=np.uint8).ctypes.data
        return address == self._address

    def tell(self) -> int:
        return self.position

    def seekable(self) -> bool:
        return False
