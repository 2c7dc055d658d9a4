"""Auth against real servers: tokens at the metadata service, capabilities at the data nodes."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from cluster_kit import three_nodes

from graben.store import Client, PermissionDenied, Unavailable, connect
from graben.store._hashing import chunk_ref
from graben.store._types import Capability, ChunkRef
from graben.store.client import _loop
from graben.store.local import cluster_up
from graben.store.transport import ChunkCall, NodeQuery, Written
from graben.store.transport._remote import RemoteChunks
from graben.store.transport._requests import GetLayout, Grant, Prepare
from graben.store.wire._auth import client_token, grant, load_secret
from graben.store.wire._frames import NIL, decode, encode
from graben.store.wire._rpc import Connection

OTHER_SECRET = b"not-the-cluster-secret-at-all"


def _secret() -> bytes:
    return load_secret(os.environ["GRABEN_SECRET_FILE"])


@pytest.fixture(scope="module")
def cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A cluster of this module's own: its tests fsck the whole cluster (see tests/conftest.py)."""
    with three_nodes(tmp_path_factory) as url:
        yield url


@pytest.fixture
def authorised(cluster_url: str) -> Client:
    with connect(cluster_url) as client:
        for entry in client.ls("/"):
            client.rm(entry.path, recursive=True)
        yield client


@pytest.mark.parametrize("token", ["", "f" * 64])
def test_a_client_without_a_valid_token_is_refused_and_writes_nothing(
    cluster_url: str, authorised: Client, token: str
) -> None:
    before = authorised.fsck().problems
    with connect(cluster_url, token=token) as stranger:
        with pytest.raises(PermissionDenied, match="GRABEN_SECRET_FILE"):
            stranger.put("/intruder", b"x" * 100_000)
        with pytest.raises(PermissionDenied):
            stranger.ls("/")
    assert not authorised.exists("/intruder")
    assert authorised.fsck().problems == before  # not even an orphan chunk reached a node


def test_a_token_from_the_environment_works(
    cluster_url: str, authorised: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = client_token(_secret())
    monkeypatch.delenv("GRABEN_SECRET_FILE")
    monkeypatch.setenv("GRABEN_TOKEN", token)
    with connect(cluster_url) as client:
        client.put("/by-token", b"hello")
        assert client.get("/by-token") == b"hello"


async def _node_call(address: str, op: str, body: msgspec.Raw = NIL, **kw: object) -> msgspec.Raw:
    host, _, port = address.rpartition(":")
    conn = await Connection.open(host, int(port))
    try:
        reply, _ = await conn.call(op, body, **kw)  # type: ignore[arg-type]
        return reply
    finally:
        await conn.close()


def _read(address: str, chunk: ChunkRef, cap: Capability) -> bytes:
    into = bytearray(chunk.length)

    async def go() -> None:
        body = encode(ChunkCall(chunk, cap))
        await _node_call(address, "chunk.read", body, into=memoryview(into))

    _loop.run(go())
    return bytes(into)


def _forge(cap: Capability, **change: object) -> Capability:
    return msgspec.structs.replace(cap, **change)


def test_data_nodes_read_only_with_the_right_capability(authorised: Client) -> None:
    data = os.urandom(100_000)  # past the inline limit: a chunk on a node
    authorised.put("/secret-data", data, replication=1)
    layout = _loop.run(authorised.aio.meta.request(GetLayout("/secret-data")))
    chunk = layout.extents[0].chunk
    (node,) = layout.replicas[chunk.id]
    address = next(n.address for n in authorised.health().nodes if n.id == node)
    cap = layout.grants[chunk.id]
    assert _read(address, chunk, cap) == data  # the capability the layout came with works

    now = time.time()
    store = authorised.health().store_id
    assert _read(address, chunk, grant(_secret(), chunk.id, "read", 60, now, store=store)) == data
    refused: dict[str, Capability] = {
        "another store": grant(_secret(), chunk.id, "read", 60, now, store="f" * 32),
        "no store": grant(_secret(), chunk.id, "read", 60, now),
        "bad mac": _forge(cap, mac="0" * 64),
        "expired": grant(_secret(), chunk.id, "read", 1.0, now - 10, store=store),
        "another chunk": grant(_secret(), "a" * 64, "read", 60, now, store=store),
        "another op": grant(_secret(), chunk.id, "write", 60, now, store=store),
        "another secret": grant(OTHER_SECRET, chunk.id, "read", 60, now, store=store),
        "stretched expiry": _forge(cap, expires=cap.expires + 3600),
    }
    for why, bad in refused.items():
        with pytest.raises(PermissionDenied):
            _read(address, chunk, bad)
            pytest.fail(f"a capability with {why} was accepted")


def test_data_nodes_write_and_delete_only_with_the_right_capability(
    authorised: Client,
) -> None:
    authorised.put("/anchor", b"a", replication=1)
    health = authorised.health()
    address, store = health.nodes[0].address, health.store_id
    data = os.urandom(10_000)
    chunk = chunk_ref(data)
    read_cap = grant(_secret(), chunk.id, "read", 60, time.time(), store=store)

    async def write(cap: Capability) -> None:
        await _node_call(
            address, "chunk.write", encode(ChunkCall(chunk, cap)), payload=memoryview(data)
        )

    async def inventory(token: str) -> list[tuple[str, float]]:
        body = await _node_call(address, "chunk.inventory", encode(NodeQuery(store)), token=token)
        found: list[tuple[str, float]] = decode(body, list[tuple[str, float]])
        return found

    with pytest.raises(PermissionDenied):
        _loop.run(write(read_cap))
    with pytest.raises(PermissionDenied):
        _loop.run(inventory(""))
    token = client_token(_secret())
    assert chunk.id not in {c for c, _ in _loop.run(inventory(token))}  # nothing was written

    _loop.run(write(grant(_secret(), chunk.id, "write", 60, time.time(), store=store)))
    assert _read(address, chunk, read_cap) == data

    async def delete(cap: Capability) -> bool:
        body = await _node_call(address, "chunk.delete", encode((chunk.id, time.time(), cap)))
        gone: bool = decode(body, bool)
        return gone

    for bad in (read_cap, grant(OTHER_SECRET, chunk.id, "delete", 60, time.time())):
        with pytest.raises(PermissionDenied):
            _loop.run(delete(bad))
    assert _read(address, chunk, read_cap) == data  # still there
    assert _loop.run(delete(grant(_secret(), chunk.id, "delete", 60, time.time(), store=store)))


def test_clients_are_granted_deletes_of_orphans_only(authorised: Client) -> None:
    authorised.put("/live", b"live data")
    live = _loop.run(authorised.aio.meta.request(GetLayout("/live"))).extents[0].chunk.id
    ask = authorised.aio.meta.request
    with pytest.raises(PermissionDenied, match="only orphan copies"):
        _loop.run(ask(Grant((live,), "delete")))
    (cap,) = _loop.run(ask(Grant(("b" * 64,), "delete")))
    assert (cap.chunk, cap.op) == ("b" * 64, "delete")


def _graben(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "graben.store.cli", *argv],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_servers_refuse_to_start_without_a_secret(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRABEN_SECRET")}
    meta = _graben("meta", "serve", "--engine", f"sqlite:///{tmp_path}/m.db", env=env)
    node = _graben("node", "serve", "--data", str(tmp_path / "n"), "--meta", "127.0.0.1:1", env=env)
    exposed = tmp_path / "exposed"
    exposed.write_text("x" * 32)
    exposed.chmod(0o644)
    open_file = _graben(
        *("meta", "serve", "--engine", f"sqlite:///{tmp_path}/m.db"),
        *("--secret-file", str(exposed)),
        env=env,
    )
    for result, why in ((meta, "no cluster secret"), (node, "no cluster secret")):
        assert result.returncode != 0
        assert why in result.stderr
    assert open_file.returncode != 0
    assert "chmod 600" in open_file.stderr


def test_cluster_up_makes_a_private_secret_that_clients_need(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with cluster_up(tmp_path, nodes=1) as url:
        secret = tmp_path / "secret"
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600
        with connect(url) as client, pytest.raises(PermissionDenied):  # the session's secret
            client.ls("/")
        monkeypatch.setenv("GRABEN_SECRET_FILE", str(secret))
        with connect(url) as client:
            client.put("/f", b"ok", replication=1)
            assert client.get("/f") == b"ok"


def test_a_grouped_write_stores_only_the_chunks_it_may(authorised: Client) -> None:
    authorised.put("/anchor", b"a", replication=1)
    health = authorised.health()
    address, store = health.nodes[0].address, health.store_id
    good, bad = os.urandom(3000), os.urandom(3000)
    ok, refused = chunk_ref(good), chunk_ref(bad)
    now = time.time()
    calls = [
        ChunkCall(ok, grant(_secret(), ok.id, "write", 60, now, store=store)),
        ChunkCall(refused, grant(_secret(), refused.id, "read", 60, now, store=store)),
    ]

    async def write_many() -> list[Written]:
        body = await _node_call(
            address, "chunk.write_many", encode(calls), payload=memoryview(good + bad)
        )
        outcomes: list[Written] = decode(body, list[Written])
        return outcomes

    outcomes = _loop.run(write_many())
    assert outcomes[0].error is None and outcomes[0].receipt is not None
    assert outcomes[0].receipt.chunk == ok.id  # the node's word that it holds the bytes
    assert outcomes[1].error is not None and outcomes[1].error.code == PermissionDenied.code
    assert outcomes[1].receipt is None
    assert _read(address, ok, grant(_secret(), ok.id, "read", 60, now, store=store)) == good
    with pytest.raises(FileNotFoundError):
        _read(address, refused, grant(_secret(), refused.id, "read", 60, now, store=store))


def test_chain_replication_stores_a_copy_on_every_node_of_the_chain(authorised: Client) -> None:
    data = os.urandom(200_000)
    chunk = chunk_ref(data)
    chunks = authorised.aio.chunks
    assert isinstance(chunks, RemoteChunks)

    async def scenario() -> list[bytes]:
        [placement] = await authorised.aio.meta.request(Prepare((chunk,), 3))
        await chunks.write_chain(placement.nodes, chunk, memoryview(data))
        copies = []
        for node in placement.nodes:
            into = bytearray(chunk.length)
            await chunks.read(node, chunk, memoryview(into))
            copies.append(bytes(into))
        return copies

    assert _loop.run(scenario()) == [data] * 3


def test_a_chain_whose_next_hop_is_down_fails_the_write(authorised: Client) -> None:
    authorised.put("/anchor", b"a", replication=1)
    health = authorised.health()
    address = health.nodes[0].address
    data = os.urandom(10_000)
    chunk = chunk_ref(data)
    cap = grant(_secret(), chunk.id, "write", 60, time.time(), store=health.store_id)
    call = ChunkCall(chunk, cap, forward=("127.0.0.1:1",))  # nobody listens on port 1
    with pytest.raises(Unavailable):
        _loop.run(_node_call(address, "chunk.write", encode(call), payload=memoryview(data)))
