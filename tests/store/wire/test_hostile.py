"""Servers under hostile peers (issue 22, item 5): what a peer without the
cluster secret can make a server hold is bounded, idle connections go, and
nothing a peer sends takes a server down. Real server processes on loopback;
memory is the server's resident set, read from /proc.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_kit import LocalCluster

from graben.store import connect
from graben.store._types import Capability, ChunkRef
from graben.store.transport import ChunkCall
from graben.store.wire._frames import MAGIC, PREFIX, Call, encode, frame_prefix

IDLE_S = 3.0
MiB = 1 << 20


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    idle = ("--idle-timeout", str(IDLE_S))
    kit = LocalCluster(
        tmp_path_factory.mktemp("hostile"), 3, meta_args=idle, node_args=idle, replication=3
    )
    try:
        yield kit
    finally:
        kit.close()


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


@contextlib.contextmanager
def _sockets(address: tuple[str, int], count: int) -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            socks.append(socket.create_connection(address, timeout=5))
        yield socks
    finally:
        for s in socks:
            s.close()


def _still_serves(kit: LocalCluster) -> None:
    with connect(kit.url) as c:
        c.put("/alive", b"yes")
        assert c.get("/alive") == b"yes"


def _closed_by_peer(s: socket.socket, within: float) -> bool:
    s.settimeout(within)
    try:
        while s.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionError:
        return True
    return True


def test_frames_claiming_huge_payloads_without_the_secret_cost_no_memory(
    cluster: LocalCluster,
) -> None:
    meta, node = cluster.meta.pid, cluster.nodes[0].pid
    before = _rss(meta), _rss(node)
    chunk = ChunkRef("ab" * 32, 256 * MiB, 0)
    forged = encode(ChunkCall(chunk, Capability(chunk.id, "write", 1e12, "00" * 32)))
    attacks = [
        (cluster.meta_address, frame_prefix(Call(1, "meta", token=""), 512 * MiB)),
        (cluster.meta_address, frame_prefix(Call(1, "meta", token="", bulk=True), 60 * MiB)),
        (cluster.addresses[0], frame_prefix(Call(1, "chunk.write", forged), 256 * MiB)),
        (cluster.addresses[0], frame_prefix(Call(1, "chunk.inventory"), 512 * MiB)),
    ]
    with contextlib.ExitStack() as stack:
        for where, prefix in attacks:
            for s in stack.enter_context(_sockets(_address(where), 8)):
                s.sendall(prefix + b"\0" * MiB)
        time.sleep(1.0)
        grown = _rss(meta) - before[0], _rss(node) - before[1]
        assert grown[0] < 32 * MiB, f"the metadata service grew by {grown[0] >> 20} MiB"
        assert grown[1] < 32 * MiB, f"the data node grew by {grown[1] >> 20} MiB"
        _still_serves(cluster)


def test_large_headers_from_anyone_are_bounded_and_dropped_when_stalled(
    cluster: LocalCluster,
) -> None:
    meta = cluster.meta.pid
    before = _rss(meta)
    claim = PREFIX.pack(MAGIC, MiB - 1, 0)
    with _sockets(_address(cluster.meta_address), 200) as socks:
        for s in socks:
            s.sendall(claim + b"\x90" * (512 << 10))
        time.sleep(1.0)
        grown = _rss(meta) - before
        # 64 MiB of grown buffers at most, whatever 200 peers ask for.
        assert grown < 120 * MiB, f"the metadata service grew by {grown >> 20} MiB"
        _still_serves(cluster)
        assert all(_closed_by_peer(s, IDLE_S + 10) for s in socks)
    _still_serves(cluster)


def test_a_thousand_idle_connections_are_dropped(cluster: LocalCluster) -> None:
    before = _rss(cluster.meta.pid)
    with _sockets(_address(cluster.meta_address), 1000) as socks:
        time.sleep(0.5)
        grown = _rss(cluster.meta.pid) - before
        assert grown < 100 * MiB, f"1,000 idle connections cost {grown >> 20} MiB"
        deadline = time.monotonic() + IDLE_S + 10
        assert all(_closed_by_peer(s, max(0.1, deadline - time.monotonic())) for s in socks)
    _still_serves(cluster)


def test_a_client_idle_past_the_servers_timeout_carries_on(cluster: LocalCluster) -> None:
    with connect(cluster.url) as c:
        c.put("/before", b"1")
        time.sleep(IDLE_S + 3)  # the servers dropped this client's connections meanwhile
        c.put("/after", b"2")
        assert c.get("/before") + c.get("/after") == b"12"


def test_a_deeply_nested_header_drops_that_connection_only(cluster: LocalCluster) -> None:
    nested = b"\x91" * 200_000 + b"\xc0"
    for where in (cluster.meta_address, cluster.addresses[1]):
        with _sockets(_address(where), 1) as [s]:
            s.sendall(PREFIX.pack(MAGIC, len(nested), 0) + nested)
            assert _closed_by_peer(s, 10)
    _still_serves(cluster)
