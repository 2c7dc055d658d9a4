"""An embedded store is made by its first write, never by a read: ``connect("/typo")``
reads nothing and leaves nothing behind (a misspelt path used to become a new, empty
store); its root reads as an empty directory (what a mount or fsspec asks first)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from graben.store import AsyncClient, GrabenFileSystem, NotADirectory, NotFound, connect


def test_reads_of_a_missing_store_make_nothing_and_name_it(tmp_path: Path) -> None:
    typo = tmp_path / "typo" / "store"
    with connect(typo) as client:
        assert client.ls("/") == [] and client.stat("/").is_dir  # the root: empty
        assert client.whoami() is None  # a mount asks, before anything is written
        assert not client.exists("/data.bin")
        for read in (
            lambda: client.get("/data.bin"),
            lambda: client.open("/data.bin"),
            lambda: client.stat("/data.bin"),
            lambda: client.ls("/runs"),
            lambda: client.du("/"),
            client.fsck,
            lambda: client.rm("/data.bin"),
        ):
            with pytest.raises(NotFound, match="no store here") as caught:
                read()
            assert caught.value.path == str(typo)
        health = client.health()  # a mount's df: an empty store, on the disk it will use
        assert (
            health.nodes[0].total == os.statvfs(tmp_path).f_blocks * os.statvfs(tmp_path).f_frsize
        )
        assert health.degraded == health.bad == 0
    assert not (tmp_path / "typo").exists()


def test_an_empty_directory_is_a_store_not_made_yet(tmp_path: Path) -> None:
    with connect(tmp_path) as client, pytest.raises(NotFound, match="no store here"):
        client.fsck()
    assert list(tmp_path.iterdir()) == []
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("first", ["put", "mkdir", "open", "fsspec"])
def test_the_first_write_makes_the_store(tmp_path: Path, first: str) -> None:
    where = tmp_path / "new"
    with connect(where) as client:
        if first == "put":
            client.put("/a", b"x" * 100_000)
        elif first == "mkdir":
            client.mkdir("/a")
        elif first == "open":
            with client.open("/a", "wb") as f:
                f.write(os.urandom(3 << 20))
        else:
            fs = GrabenFileSystem(url=str(where), skip_instance_cache=True)
            assert fs.ls("/") == [] and not where.exists()
            fs.pipe_file("/a", b"x")
        assert [e.name for e in client.ls("/")] == ["a"]
        assert client.health().store_id
    assert (where / "meta.db").exists()
    with connect(where) as again:  # made: opened as any store
        assert [e.name for e in again.ls("/")] == ["a"]


def test_a_store_made_by_another_client_is_seen(tmp_path: Path) -> None:
    where = tmp_path / "shared"
    with connect(where) as reader, connect(where) as writer:
        assert reader.ls("/") == []
        writer.put("/x", b"written elsewhere")
        assert reader.get("/x") == b"written elsewhere"


def test_a_file_is_still_refused_at_connect(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(NotADirectory):
        connect(tmp_path / "file")


def test_the_async_client_makes_it_on_its_first_write_too(tmp_path: Path) -> None:
    async def run() -> None:
        async with AsyncClient(tmp_path / "s") as client:
            with pytest.raises(NotFound, match="no store here"):
                await client.get("/x")
            assert not (tmp_path / "s").exists()
            await client.put("/x", b"1")
            assert await client.get("/x") == b"1"

    asyncio.run(run())
