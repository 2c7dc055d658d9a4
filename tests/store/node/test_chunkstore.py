"""A data node's chunk files: read in aligned pieces, each whole chunk checked."""

from __future__ import annotations

import asyncio
import itertools
import os
from pathlib import Path

import pytest

from graben.store import IntegrityError
from graben.store._hashing import chunk_ref
from graben.store.embedded._store import LocalChunks
from graben.store.meta import LOCAL_NODE
from graben.store.node._chunkstore import MIN_READ_PIECE, LocalChunkStore, read_spans


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


def test_a_cache_keeps_checked_chunks_and_evicts_those_read_longest_ago(tmp_path: Path) -> None:
    from graben.store.node._chunkstore import LocalChunkStore

    cache = LocalChunkStore(tmp_path / "cache")
    try:
        chunks = [os.urandom(1000 + i) for i in range(4)]
        refs = [chunk_ref(c) for c in chunks]
        for i, (ref, data) in enumerate(zip(refs, chunks, strict=True)):
            cache.keep(ref, memoryview(data))
            os.utime(cache.path(ref.id), (1000 + i, 1000 + i))  # older first
        os.utime(cache.path(refs[0].id))  # the oldest read again just now
        with pytest.raises(IntegrityError):
            cache.keep(refs[0], memoryview(chunks[1]))  # bytes that are not the chunk
        assert cache.evict(1500) == 1001 + 1002
        left = sorted(p.name for p, _, _ in cache.files())
        assert left == sorted([refs[0].id, refs[3].id])
    finally:
        cache.close()
