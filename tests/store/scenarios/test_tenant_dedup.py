"""Deduplication does not cross tenants, on a real cluster (one service, three nodes).

A tenant's token learns nothing of bytes outside its scope: ``Prepare`` and a
write grant answer alike whether or not another tenant stores those bytes, and
a commit may name a chunk only if its writer uploaded the bytes (a node's
receipt for every copy it claims) or a file in its own scope uses it already.
Deduplication within a tenant, and for the operator, stays.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import msgspec
import pytest
from cluster_kit import LocalCluster

from graben.store import Client, NotFound, PermissionDenied, connect
from graben.store._hashing import chunk_ref
from graben.store._types import ChunkRef, Extent, FileCommit, Receipt, StoredChunk
from graben.store.client import _loop
from graben.store.transport import Grant
from graben.store.transport._requests import Commit, GetLayout, Prepare

B_BYTES = b"b's checkpoint shard " * 20_000  # on the nodes (over the inline limit)
B_SMALL = b"b's small secret"  # kept inline by the engine


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("dedup"), 3, replication=2)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def operator(cluster: LocalCluster) -> Iterator[Client]:
    with connect(cluster.url) as client:
        client.add_tenant("a", "/teams/a")
        client.add_tenant("b", "/teams/b")
        client.put("/teams/b/shard.bin", B_BYTES)
        client.put("/teams/b/small", B_SMALL)
        client.mkdir("/teams/a", exist_ok=True)
        yield client


@pytest.fixture(scope="module")
def team_a(cluster: LocalCluster, operator: Client) -> Iterator[Client]:
    with connect(cluster.url, token=operator.issue_token("a", rights="rw")) as client:
        yield client


def _prepare(client: Client, chunk: ChunkRef, path: str = "/teams/a/f") -> tuple[bool, int, bool]:
    """What a Prepare tells its caller of a chunk: upload?, how many nodes, a grant?"""
    ask = Prepare((chunk,), 0, paths=(path,), sent=(0,))
    [placement] = _loop.run(client.aio.meta.request(ask))
    return placement.upload, len(placement.nodes), placement.grant is not None


def _commit(client: Client, path: str, chunk: ChunkRef, *stored: StoredChunk) -> None:
    files = (FileCommit(path, (Extent(0, chunk.length, chunk),), stored),)
    _loop.run(client.aio.meta.request(Commit(files)))


def _refusal(client: Client, path: str, chunk: ChunkRef, *stored: StoredChunk) -> str:
    with pytest.raises(PermissionDenied) as refused:
        _commit(client, path, chunk, *stored)
    return str(refused.value).replace(chunk.id, "<chunk>")


def test_prepare_and_write_grants_answer_alike_whether_or_not_b_holds_the_bytes(
    team_a: Client, operator: Client
) -> None:
    held, fresh = chunk_ref(B_BYTES), chunk_ref(os.urandom(len(B_BYTES)))
    assert _prepare(team_a, held) == _prepare(team_a, fresh) == (True, 2, True)
    for chunk in (held, fresh):  # no "in use by a file"
        [cap] = _loop.run(team_a.aio.meta.request(Grant((chunk.id,), "write")))
        assert cap.chunk == chunk.id and cap.op == "write"
    assert _prepare(operator, held)[0] is False  # the operator's writes still deduplicate


def test_a_commit_naming_bs_chunk_without_its_bytes_is_refused_and_reads_nothing(
    team_a: Client, operator: Client
) -> None:
    layout = _loop.run(operator.aio.meta.request(GetLayout("/teams/b/shard.bin")))
    theirs = layout.extents[0].chunk
    small = chunk_ref(B_SMALL)
    never = chunk_ref(os.urandom(len(B_BYTES)))  # nobody stores it
    said = {_refusal(team_a, "/teams/a/stolen", c) for c in (theirs, small, never)}
    assert len(said) == 1  # the same refusal, held by b or by nobody
    node = layout.replicas[theirs.id][0]
    claimed = StoredChunk(theirs, (node,))  # "I stored it on that node", with no receipt
    assert "no receipt" in _refusal(team_a, "/teams/a/stolen", theirs, claimed)
    with pytest.raises(NotFound):
        team_a.get("/teams/a/stolen")
    assert operator.get("/teams/b/shard.bin") == B_BYTES


def test_a_forged_or_borrowed_receipt_is_refused(team_a: Client, operator: Client) -> None:
    layout = _loop.run(operator.aio.meta.request(GetLayout("/teams/b/shard.bin")))
    theirs = layout.extents[0].chunk
    node = layout.replicas[theirs.id][0]
    own = os.urandom(300_000)  # a's own upload: a real receipt, for another chunk
    team_a.put("/teams/a/own.bin", own, replication=1)
    receipts = _receipts_of(team_a, own)
    mine = receipts[0]
    borrowed = StoredChunk(theirs, (mine.node,), receipts=(mine,))
    assert "is for chunk" in _refusal(team_a, "/teams/a/stolen", theirs, borrowed)
    forged = Receipt(theirs.id, node, time.time() + 3600, "00" * 32, mine.store)
    claimed = StoredChunk(theirs, (node,), receipts=(forged,))
    assert "forged" in _refusal(team_a, "/teams/a/stolen", theirs, claimed)
    stale = msgspec.structs.replace(mine, chunk=theirs.id)  # the MAC no longer fits
    claimed = StoredChunk(theirs, (mine.node,), receipts=(stale,))
    assert "forged" in _refusal(team_a, "/teams/a/stolen", theirs, claimed)


def test_a_tenant_holding_the_same_bytes_stores_and_reads_them(
    team_a: Client, operator: Client
) -> None:
    team_a.put("/teams/a/same.bin", B_BYTES)  # uploads them: its proof
    assert team_a.get("/teams/a/same.bin") == B_BYTES
    ours = _loop.run(team_a.aio.meta.request(GetLayout("/teams/a/same.bin")))
    theirs = _loop.run(operator.aio.meta.request(GetLayout("/teams/b/shard.bin")))
    assert ours.extents[0].chunk == theirs.extents[0].chunk  # one chunk on the nodes
    team_a.put("/teams/a/small", B_SMALL)  # inline: the bytes travel with the commit
    assert team_a.get("/teams/a/small") == B_SMALL


def test_deduplication_within_a_tenant_stays(team_a: Client) -> None:
    data = os.urandom(500_000)
    team_a.put("/teams/a/one.bin", data)
    chunk = chunk_ref(data)
    assert _prepare(team_a, chunk, "/teams/a/two.bin")[0] is False  # held in its own scope
    _commit(team_a, "/teams/a/two.bin", chunk)  # named without upload: its own file uses it
    assert team_a.get("/teams/a/two.bin") == data
    team_a.copy("/teams/a/one.bin", "/teams/a/three.bin")  # shares the chunks, as before
    assert team_a.get("/teams/a/three.bin") == data


def _receipts_of(client: Client, data: bytes) -> list[Receipt]:
    """Receipts a node gives for ``data`` written to it with a fresh placement."""
    chunk = chunk_ref(data)

    async def write() -> list[Receipt]:
        ask = Prepare((chunk,), 1, paths=("/teams/a/x",), sent=(0,))
        [placement] = await client.aio.meta.request(ask)
        node = placement.nodes[0]
        receipt = await client.aio.chunks.write(node, chunk, memoryview(data))
        assert receipt is not None and receipt.node == node
        return [receipt]

    return _loop.run(write())
