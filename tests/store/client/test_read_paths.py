"""The read paths: sync fast path, async path, read-ahead hints, failover errors."""

from __future__ import annotations

import asyncio
import mmap
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from store_kit import SMALL_CHUNK

from graben.store import IntegrityError, connect
from graben.store._hashing import chunk_ref
from graben.store.node._chunkstore import LocalChunkStore


def test_chunk_sized_reads_match_at_every_alignment(store_dir: Path) -> None:
    data = os.urandom(5 * SMALL_CHUNK + 333)
    with connect(store_dir, chunk_size=SMALL_CHUNK) as client:
        client.put("/f", data)
        for start in (0, 1, SMALL_CHUNK, SMALL_CHUNK + 7):
            buf = bytearray(SMALL_CHUNK)  # chunk-sized: the fast path where aligned
            out = bytearray()
            with client.open("/f") as f:
                f.seek(start)
                while n := f.readinto(buf):
                    out += buf[:n]
            assert out == data[start:]


def test_fast_path_reports_corruption_like_the_async_path(
    store_dir: Path, chunk_files: Callable[[], list[Path]]
) -> None:
    data = os.urandom(2 * SMALL_CHUNK)
    with connect(store_dir, chunk_size=SMALL_CHUNK) as client:
        client.put("/f", data)
        victim = chunk_files()[0]
        with open(victim, "r+b") as f:
            first = f.read(1)
            f.seek(0)  # the read moved on: written without it, the byte after (1 in 256: the same)
            f.write(b"\x00" if first != b"\x00" else b"\x01")
        buf = mmap.mmap(-1, SMALL_CHUNK)
        with client.open("/f") as f, pytest.raises(IntegrityError) as info:
            while f.readinto(buf):
                pass
        assert "/f at offset" in str(info.value) and str(victim) in str(info.value)
        buf.close()


def test_readahead_probe_sees_the_page_cache(tmp_path: Path) -> None:
    store = LocalChunkStore(tmp_path)
    data = os.urandom(3 << 20)
    ref = chunk_ref(data)
    store.write(ref, memoryview(data))
    store.read(ref, memoryview(bytearray(len(data))))
    assert store.uncached([ref]) == []
    fd = os.open(store.path(ref.id), os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    assert store.uncached([ref]) == [ref]
    store.prefetch(ref)  # the kernel may take a moment; the read must work either way
    into = bytearray(len(data))
    store.read(ref, memoryview(into))
    assert into == data
    store.close()


def test_sequential_reader_with_read_ahead_reads_everything(store_dir: Path) -> None:
    data = os.urandom(40 * SMALL_CHUNK + 5)

    async def main() -> bytes:
        from graben.store import AsyncClient

        async with AsyncClient(store_dir, chunk_size=SMALL_CHUNK, read_ahead=4) as c:
            await c.put("/f", data)
            out = bytearray()
            async with c.open("/f") as f:
                while piece := await f.read(SMALL_CHUNK):
                    out += piece
            return bytes(out)

    assert asyncio.run(main()) == data
