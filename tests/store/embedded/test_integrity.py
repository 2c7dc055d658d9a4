"""Checksums, fsck, dedup and collection on an embedded store."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from store_kit import SMALL_CHUNK

from graben.store import IntegrityError, connect

ChunkFiles = Callable[[], list[Path]]


def flip_byte(path: Path, offset: int = 100) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_flipped_byte_is_caught_on_read_and_by_fsck(
    store_dir: Path, chunk_files: ChunkFiles
) -> None:
    with connect(store_dir, chunk_size=SMALL_CHUNK) as client:
        client.put("/good", os.urandom(1000))
        client.put("/model.pt", os.urandom(3 * SMALL_CHUNK))
        good = set(chunk_files())
        layout_chunks = [p for p in chunk_files() if p.stat().st_size == SMALL_CHUNK]
        victim = layout_chunks[1]
        flip_byte(victim)

        with pytest.raises(IntegrityError) as info:
            client.get("/model.pt")
        message = str(info.value)
        assert "/model.pt" in message and "crc32c" in message
        assert str(victim) in message
        assert client.get("/good")  # the rest of the store still reads

        report = client.fsck()
        assert not report.ok
        [problem] = report.problems
        assert problem.kind == "corrupt"
        assert problem.chunk == victim.name
        assert problem.paths == ("/model.pt",)
        assert str(victim) in problem.where
        assert set(chunk_files()) == good  # fsck changes nothing


def test_missing_chunk_is_an_integrity_error_not_file_not_found(
    store_dir: Path, chunk_files: ChunkFiles
) -> None:
    with connect(store_dir) as client:
        client.put("/f", os.urandom(100_000))  # past the inline limit: a chunk file
        [chunk] = chunk_files()
        chunk.unlink()
        with pytest.raises(IntegrityError, match="missing"):
            client.get("/f")
        [problem] = client.fsck().problems
        assert (problem.kind, problem.paths) == ("missing", ("/f",))


def test_truncated_chunk_is_caught(store_dir: Path, chunk_files: ChunkFiles) -> None:
    with connect(store_dir) as client:
        client.put("/f", os.urandom(100_000))  # past the inline limit: a chunk file
        [chunk] = chunk_files()
        os.truncate(chunk, 4000)
        with pytest.raises(IntegrityError, match="wrong length"):
            client.get("/f")


def test_same_100_mib_twice_is_stored_once(store_dir: Path, chunk_files: ChunkFiles) -> None:
    data = os.urandom(100 << 20)
    with connect(store_dir) as client:
        client.put("/a/weights.bin", data)
        first = {p: p.stat().st_mtime_ns for p in chunk_files()}
        with client.open("/b/weights.bin", "wb") as f:
            for start in range(0, len(data), 1 << 20):
                f.write(data[start : start + (1 << 20)])
        after = {p: p.stat().st_mtime_ns for p in chunk_files()}
        assert after == first  # nothing uploaded, nothing rewritten
        assert sum(p.stat().st_size for p in after) == len(data)
        assert client.get("/b/weights.bin") == data
        assert client.du("/") == (2, 2 * len(data))


def test_chunks_survive_while_any_file_uses_them(store_dir: Path, chunk_files: ChunkFiles) -> None:
    data = os.urandom(3 * SMALL_CHUNK)
    with connect(store_dir, chunk_size=SMALL_CHUNK, gc_grace_s=0) as client:
        client.put("/a", data)
        client.put("/b", data)
        client.rm("/a")
        assert client.fsck(collect=True).collected == 0
        assert client.get("/b") == data
        client.rm("/b")
        report = client.fsck(collect=True)
        assert report.collected == 3
        assert chunk_files() == []


def test_collection_waits_for_the_grace_period(store_dir: Path, chunk_files: ChunkFiles) -> None:
    with connect(store_dir, gc_grace_s=3600) as client:
        client.put("/a", b"x" * 100_000)
        client.rm("/a")
        assert client.fsck(collect=True).collected == 0
        assert len(chunk_files()) == 1


@pytest.mark.parametrize("hashed_here", [False, True], ids=["node", "embedded"])
def test_writer_rejects_bytes_that_do_not_match_their_crc(
    store_dir: Path, hashed_here: bool
) -> None:
    """Also where the writers hashed the bytes in this process (an embedded store, which
    skips blake3): bytes changed since (a buffer written to while it was stored) fail
    their crc32c and are not stored."""
    from graben.store._hashing import chunk_ref
    from graben.store.node._chunkstore import LocalChunkStore

    store = LocalChunkStore(store_dir / "chunks", hashed_here=hashed_here)
    try:
        data = bytearray(os.urandom(100_000))
        ref = chunk_ref(data)
        data[50_000] ^= 1
        with pytest.raises(IntegrityError, match="crc32c; not stored"):
            store.write(ref, memoryview(data))
        assert not store.path(ref.id).exists()
        data[50_000] ^= 1
        store.write(ref, memoryview(data))
        assert store.path(ref.id).read_bytes() == data
    finally:
        store.close()


def test_opening_a_store_sweeps_temporaries_of_dead_writers(store_dir: Path) -> None:
    with connect(store_dir) as client:
        client.mkdir("/", exist_ok=True)  # a store is made by its first write
    tmp = store_dir / "chunks" / "tmp"
    stale, fresh = tmp / "dead-writer.123.abcd", tmp / "live-writer.456.ef01"
    stale.write_bytes(b"half a chunk")
    fresh.write_bytes(b"being written")
    two_hours_ago = time.time() - 7200
    os.utime(stale, (two_hours_ago, two_hours_ago))
    with connect(store_dir) as client:
        assert not stale.exists()
        assert fresh.exists()
        assert not [p for p in client.fsck().problems if p.kind != "orphan"]
