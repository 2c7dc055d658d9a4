"""Checksums: crc32c_combine must agree with checksumming the joined bytes."""

from __future__ import annotations

import asyncio
import itertools
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from graben.store import IntegrityError
from graben.store._hashing import chunk_ref, crc32c, crc32c_combine
from graben.store.embedded._store import LocalChunks
from graben.store.meta import LOCAL_NODE
from graben.store.node._chunkstore import MIN_READ_PIECE, LocalChunkStore, read_spans


@given(st.binary(max_size=2000), st.binary(max_size=2000))
def test_combine_equals_crc_of_concatenation(a: bytes, b: bytes) -> None:
    assert crc32c_combine(crc32c(a), crc32c(b), len(b)) == crc32c(a + b)


def test_combine_on_large_pieces() -> None:
    a, b = os.urandom(3 << 20), os.urandom((2 << 20) + 7)
    assert crc32c_combine(crc32c(a), crc32c(b), len(b)) == crc32c(a + b)


@pytest.mark.parametrize("size", [1, MIN_READ_PIECE, 3 * MIN_READ_PIECE + 5, 8 << 20])
def test_piecewise_reads_verify_whole_chunks(tmp_path: Path, size: int) -> None:
    store = LocalChunkStore(tmp_path)
    transport = LocalChunks(store, threads=4)
    data = os.urandom(size)
    ref = chunk_ref(data)
    store.write(ref, memoryview(data))
    into = bytearray(size)

    async def read() -> None:
        await transport.read(LOCAL_NODE, ref, memoryview(into))

    asyncio.run(read())
    assert into == data
    path = store.path(ref.id)
    with open(path, "r+b") as f:
        f.seek(size - 1)
        f.write(bytes([data[-1] ^ 1]))
    with pytest.raises(IntegrityError, match="corrupt"):
        asyncio.run(read())
    asyncio.run(transport.close())


@pytest.mark.parametrize("length", [0, 1, 4095, MIN_READ_PIECE, 2 * MIN_READ_PIECE + 1, 8 << 20])
def test_read_spans_tile_the_chunk(length: int) -> None:
    spans = read_spans(length)
    assert spans[0][0] == 0
    assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(spans))
    assert sum(n for _, n in spans) == length
    assert all(at % 4096 == 0 for at, _ in spans)
