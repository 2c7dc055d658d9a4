"""fsck and collection page every list: no store size at which they stop working.

The fast tests lower the page size (``GRABEN_PAGE_ENTRIES``, read by servers
started as processes and by embedded stores alike) so a small store spans
many pages; the slow one runs a real 100,000-chunk cluster at the default.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_kit import LocalCluster
from collect_kit import plant_orphans

from graben.store import connect
from graben.store.client import _loop
from graben.store.transport import NodeQuery
from graben.store.transport._requests import ChunkRefs
from graben.store.wire._auth import client_token, load_secret
from graben.store.wire._frames import decode, encode
from graben.store.wire._rpc import Connection

PAGE = 7
CHUNK = 4096


def _chunk_files(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("**/chunks/??/??/*") if p.is_file())


def _blocks(count: int, tag: int) -> list[bytes]:
    """``count`` distinct 4 KiB blocks, cheap to make."""
    return [tag.to_bytes(4, "big") + i.to_bytes(8, "big") + bytes(CHUNK - 12) for i in range(count)]


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRABEN_PAGE_ENTRIES", str(PAGE))


@pytest.fixture
def cluster(tmp_path: Path, small_pages: None) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path, nodes=3)
    try:
        yield cluster
    finally:
        cluster.close()


async def _inventory_page(address: str, store: str) -> list[tuple[str, float]]:
    host, _, port = address.rpartition(":")
    conn = await Connection.open(host, int(port))
    try:
        token = client_token(load_secret())
        body, _ = await conn.call("chunk.inventory", encode(NodeQuery(store)), token=token)
    finally:
        await conn.close()
    found: list[tuple[str, float]] = decode(body, list[tuple[str, float]])
    return found


def test_fsck_and_collection_page_through_a_cluster(cluster: LocalCluster) -> None:
    with connect(cluster.url, chunk_size=CHUNK, gc_grace_s=0) as client:
        for i in range(6):
            client.put_parts(f"/keep/{i}", _blocks(10, i))
        for i in range(3):
            client.put_parts(f"/gone/{i}", _blocks(5, 100 + i))
        client.rm("/gone", recursive=True)  # 15 chunks unreferenced, 45 copies
        orphans = plant_orphans(cluster.node_dir(2), 20, age_s=60)
        held = len(_chunk_files(cluster.root))
        assert held == 3 * 60 + 3 * 15 + 20

        # Every reply is one page: the client has to ask again.
        page = _loop.run(client.aio.meta.request(ChunkRefs()))
        assert len(page.chunks) == PAGE
        health = client.health()
        assert len(_loop.run(_inventory_page(health.nodes[0].address, health.store_id))) == PAGE

        report = client.fsck()
        assert report.ok
        assert report.chunks == 75
        assert sorted(p.chunk for p in report.problems if p.kind == "orphan") == sorted(
            p.name for p in orphans
        )
        assert client.fsck(collect=True).collected == 20 + 45
        assert len(_chunk_files(cluster.root)) == 3 * 60
        for i in range(6):
            assert client.get(f"/keep/{i}") == b"".join(_blocks(10, i))
        assert client.fsck().problems == ()


def test_a_chunk_shared_by_many_files_lists_them_all(tmp_path: Path, small_pages: None) -> None:
    with connect(tmp_path / "s", inline_max=0) as client:  # the chunk in a file of its own
        client.put("/original", b"shared bytes")
        for i in range(30):
            client.copy("/original", f"/copies/{i:02}")
        [victim] = _chunk_files(tmp_path / "s")
        victim.unlink()
        [problem] = client.fsck().problems
        assert problem.kind == "missing"
        assert sorted(problem.paths) == sorted(
            ["/original", *(f"/copies/{i:02}" for i in range(30))]
        )


@pytest.mark.huge
@pytest.mark.timeout(1200)
def test_fsck_and_collection_of_100_000_chunks(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, nodes=1, replication=1)
    try:
        with connect(cluster.url, chunk_size=CHUNK, gc_grace_s=0) as client:
            for i in range(500):  # 200 chunks a file: a commit's request stays small
                client.put_parts(f"/f/{i}", _blocks(200, i))
            report = client.fsck()
            assert report.ok and not report.problems
            assert report.chunks == 100_000
            client.rm("/f", recursive=True)
            assert client.fsck(collect=True).collected == 100_000
        assert _chunk_files(cluster.root) == []
    finally:
        cluster.close()
