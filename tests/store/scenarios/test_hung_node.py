"""A hung data node (SIGSTOP: it answers nothing and refuses nothing) costs a writer
the replica deadline once, not the call timeout, and nothing after; repair brings
the files it missed back to full copies once it runs again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cluster_kit import LocalCluster, copies, eventually

from graben.store import Client, GrabenError, connect
from graben.store.client import _loop
from graben.store.transport._requests import GetLayout

MiB = 1 << 20
GRABEN = [sys.executable, "-m", "graben.store.cli"]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    # The metadata service's default heartbeat timeout (10 s): the client must
    # not wait for the service to notice the node is gone.
    cluster = LocalCluster(tmp_path, nodes=3, timeout=10.0, repair=0.5)
    try:
        yield cluster
    finally:
        cluster.close()


def _recorded(client: Client, path: str) -> list[int]:
    """Copies each chunk of ``path`` has in its commit, alive or not."""
    layout = _loop.run(client.aio.meta.request(GetLayout(path)))
    return [len(layout.replicas[x.chunk.id]) for x in layout.extents]


def _timed_put(client: Client, path: str, data: bytes) -> float:
    started = time.monotonic()
    client.put(path, data)
    return time.monotonic() - started


def test_a_stopped_node_costs_one_deadline_then_nothing_and_repair_catches_up(
    cluster: LocalCluster,
) -> None:
    stopped = cluster.nodes[0]
    with connect(cluster.url, timeout=20, chunk_size=MiB, replica_deadline=2.0) as client:
        client.put("/warm", b"x" * MiB)  # connections open to every node
        data = [os.urandom(4 * MiB) for _ in range(3)]
        stopped.send_signal(signal.SIGSTOP)
        try:
            first = _timed_put(client, "/first", data[0])
            after = _timed_put(client, "/second", data[1])
            started = time.monotonic()
            with pytest.raises(GrabenError):  # three copies asked: not while one node hangs
                client.put("/all-three", data[2], min_replicas=3)
            refused = time.monotonic() - started
            assert not client.exists("/all-three")
            assert client.get("/first") == data[0]
            assert client.get("/second") == data[1]  # read from the two that answer
            assert _recorded(client, "/first") == [2] * 4
            assert _recorded(client, "/second") == [2] * 4
        finally:
            stopped.send_signal(signal.SIGCONT)
        assert first < 2.0 + 2.0, first  # the deadline, plus the write itself on 2 cores
        assert after < 1.0, after  # the node is passed over at once
        assert refused < 5.0, refused
        for path in ("/first", "/second"):
            eventually(lambda p=path: copies(client, p) == [3] * 4, seconds=60)  # type: ignore[misc]
        assert client.get("/first") == data[0]


def test_a_busy_cluster_is_not_a_hung_node(cluster: LocalCluster) -> None:
    """Every node slow alike (many writers on 2 cores) must not count as stragglers:
    the deadline starts from a peer's answer, so full copies are written."""
    with connect(cluster.url, chunk_size=MiB, replica_deadline=2.0) as client:
        blobs = {f"/busy/{i}": os.urandom(2 * MiB) for i in range(24)}
        with ThreadPoolExecutor(8) as writers:
            list(writers.map(lambda item: client.put(*item), blobs.items()))
        for path in blobs:
            assert _recorded(client, path) == [3, 3]


def test_a_stopped_node_costs_a_reader_one_deadline_then_nothing(cluster: LocalCluster) -> None:
    """Every chunk's copy on the stopped node is the one readers would ask first: a
    reader asks the next copy after the deadline, and then passes the node over; a new
    client pays the deadline once too, never a connect timeout per chunk."""
    data = os.urandom(8 * MiB)
    with connect(cluster.url, timeout=20, chunk_size=MiB, replica_deadline=2.0) as client:
        client.put("/read-me", data)
        layout = _loop.run(client.aio.meta.request(GetLayout("/read-me")))
        first = {layout.replicas[x.chunk.id][0] for x in layout.extents}
        addresses = {n.id: n.address for n in client.health().nodes}
        assert len(first) == 1  # replicas are listed in one order for every chunk
        address = addresses[first.pop()]
        (victim,) = [i for i, a in enumerate(cluster.addresses) if a == address]
        stopped = cluster.nodes[victim]
        stopped.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            assert client.get("/read-me") == data
            warm = time.monotonic() - started
            with connect(cluster.url, timeout=20, replica_deadline=2.0) as fresh:
                started = time.monotonic()
                assert fresh.get("/read-me") == data
                cold = time.monotonic() - started
                started = time.monotonic()
                assert fresh.get("/read-me") == data
                again = time.monotonic() - started
        finally:
            stopped.send_signal(signal.SIGCONT)
    assert warm < 2.0 + 2.0, warm  # one deadline, then the node is passed over
    assert cold < 2.0 + 3.0, cold
    assert again < 1.0, again


@pytest.fixture
def single_copies(tmp_path: Path) -> Iterator[LocalCluster]:
    """RF=1: a chunk placed on a hung node has no other copy whose answer starts a
    deadline. The heartbeat timeout is long, so the metadata service goes on placing
    chunks on the hung node for the whole test: only the client can pass it over."""
    cluster = LocalCluster(tmp_path / "c", nodes=3, replication=1, timeout=120.0)
    try:
        yield cluster
    finally:
        cluster.close()


def test_a_hung_nodes_first_contact_costs_the_clients_timeout_once(
    single_copies: LocalCluster, tmp_path: Path
) -> None:
    """A fresh client (no connection to any node yet) writing 32 chunks, about a third
    of them placed on the hung node, waits for it once, and no longer than its
    ``timeout``: the chunks queued behind that first contact give up with it, and later
    chunks are placed elsewhere (was 10 s, the connect timeout, per chunk, one after
    the other). The same through the CLI's ``put --timeout 5``, a fresh process."""
    blobs = [os.urandom(32 * MiB) for _ in range(2)]
    src = tmp_path / "blob"
    src.write_bytes(blobs[0])
    stopped = single_copies.nodes[0]
    stopped.send_signal(signal.SIGSTOP)
    try:
        with connect(single_copies.url, timeout=5, chunk_size=MiB) as client:
            first = _timed_put(client, "/first", blobs[0])
            again = _timed_put(client, "/again", blobs[1])
            assert client.get("/first") == blobs[0] and client.get("/again") == blobs[1]
        env = {**os.environ, "GRABEN_CHUNK_SIZE": str(MiB)}
        started = time.monotonic()
        put = subprocess.run(
            [*GRABEN, "put", "--timeout", "5", str(src), f"{single_copies.url}/cli"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        cli = time.monotonic() - started
        assert put.returncode == 0, put.stderr
    finally:
        stopped.send_signal(signal.SIGCONT)
    assert first < 5.0 + 3.0, first  # the timeout once, plus the writes on 2 cores
    assert again < 2.0, again  # passed over at once
    assert cli < 5.0 + 4.0, cli  # and a process's start
