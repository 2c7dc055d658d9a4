"""Checksums and content hashes; each releases the GIL on large buffers."""

from __future__ import annotations

import blake3
import crc32c as _crc32c

from ._types import Buffer, ChunkRef


def crc32c(data: Buffer) -> int:
    """crc32c of a buffer (hardware-accelerated, GIL released)."""
    value: int = _crc32c.crc32c(data)
    return value


def chunk_ref(data: Buffer) -> ChunkRef:
    """Hash a chunk: its blake3 id, length and crc32c."""
    view = memoryview(data).cast("B")
    return ChunkRef(blake3.blake3(view).hexdigest(), view.nbytes, crc32c(view))
