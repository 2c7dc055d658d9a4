"""Degraded writes and errors that say what happened: real servers, kill -9, full disks."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from cluster_kit import LocalCluster, alive, copies, eventually

from graben.store import CannotPlace, Client, NoSpace, Unavailable, connect
from graben.store.meta._service import NODES_TTL_S

MiB = 1 << 20
HEARTBEAT_TIMEOUT = 5.0
"""Nodes heartbeat every 2 s: under load a shorter timeout makes live nodes look dead."""


def _node_id(cluster: LocalCluster, i: int) -> str:
    return (cluster.node_dir(i) / "node-id").read_text().strip()


def _wait_alive(client: Client, count: int) -> None:
    """Until ``count`` nodes are alive, and placement's cached node list (1 s) knows it."""
    eventually(lambda: alive(client) == count)
    time.sleep(NODES_TTL_S + 0.2)


def _status(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "graben.store.cli", "status", "--store", url, *extra],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


@pytest.fixture
def cluster3(tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path, nodes=3, timeout=HEARTBEAT_TIMEOUT, repair=0.5)
    try:
        yield cluster
    finally:
        cluster.close()


def test_one_dead_node_of_three_writes_go_on_at_two_copies_and_repair_adds_the_third(
    cluster3: LocalCluster,
) -> None:
    with connect(cluster3.url, chunk_size=MiB) as client:
        client.put("/before", os.urandom(MiB))
        cluster3.kill(1)
        data = os.urandom(4 * MiB)
        started = time.monotonic()
        client.put("/during", data)  # at once: the node is not yet known to be dead
        took = time.monotonic() - started
        print(f"degraded write of 4 chunks took {took:.3f} s")
        assert took < 5.0
        assert client.get("/during") == data
        assert copies(client, "/during") == [2, 2, 2, 2]
        _wait_alive(client, 2)
        data = os.urandom(4 * MiB)
        started = time.monotonic()
        client.put("/later", data)  # placement now knows: two nodes, no failed write
        print(f"degraded write after the heartbeat timeout took {time.monotonic() - started:.3f} s")
        assert time.monotonic() - started < 5.0
        assert copies(client, "/later") == [2, 2, 2, 2]

        text = _status(cluster3.url)
        assert text.returncode == 1, text.stdout + text.stderr
        assert "DEAD" in text.stdout
        short = int(text.stdout.split(" chunks short of copies")[0].rsplit(" ", 1)[-1])
        assert short == 9  # /before's 1 chunk, and 4 each of /during and /later
        as_json = _status(cluster3.url, "--json")
        assert as_json.returncode == 1, as_json.stdout + as_json.stderr
        assert json.loads(as_json.stdout)["degraded"] == short

        cluster3.start_node(1)
        eventually(lambda: copies(client, "/during") == [3, 3, 3, 3])
        eventually(lambda: copies(client, "/later") == [3, 3, 3, 3])
        assert client.get("/later") == data
        eventually(lambda: _status(cluster3.url, "--json").returncode == 0)


def test_two_dead_nodes_of_three_a_write_fails_at_once_naming_them(
    cluster3: LocalCluster,
) -> None:
    with connect(cluster3.url, timeout=2.0) as client:
        dead = [_node_id(cluster3, 0), _node_id(cluster3, 2)]
        cluster3.kill(0)
        cluster3.kill(2)
        started = time.monotonic()
        with pytest.raises(CannotPlace) as caught:
            client.put("/f", os.urandom(MiB))
        assert time.monotonic() - started < 2.0
        assert all(node in str(caught.value) for node in dead), str(caught.value)
        assert "1 of the 2 copies" in str(caught.value) or "0 of the 2" in str(caught.value)
        # Once the heartbeats stop, placement itself refuses, naming them as dead.
        _wait_alive(client, 1)
        started = time.monotonic()
        with pytest.raises(CannotPlace) as refused:
            client.put("/g", os.urandom(MiB))
        assert time.monotonic() - started < 1.0
        assert not isinstance(refused.value, ConnectionError)  # a refusal, not a lost connection
        message = str(refused.value)
        assert "2 dead" in message and all(node in message for node in dead), message
    cluster3.kill(1)  # and the last one: status says so, text and JSON alike
    with connect(cluster3.url) as client:
        _wait_alive(client, 0)
    text = _status(cluster3.url)
    assert text.returncode == 1 and "no data node is alive" in text.stdout, text.stdout
    assert _status(cluster3.url, "--json").returncode == 1


def test_min_replicas_three_refuses_a_degraded_write(tmp_path: Path) -> None:
    cluster = LocalCluster(
        tmp_path, nodes=3, timeout=HEARTBEAT_TIMEOUT, meta_args=("--min-replicas", "3")
    )
    try:
        with connect(cluster.url) as client:
            cluster.kill(1)
            _wait_alive(client, 2)
            with pytest.raises(CannotPlace, match="need 3 nodes, 2 of 3 eligible; 1 dead"):
                client.put("/f", b"x" * 100_000)  # past the inline limit: to the nodes
            client.put("/tiny", b"t" * 1000)  # the engine keeps it: no node needed
        with connect(cluster.url, min_replicas=1) as client:  # the client may ask for less
            client.put("/f", b"x" * 100_000)
            assert copies(client, "/f") == [2]
        with connect(cluster.url) as client:  # and so may one file
            client.put("/g", b"y" * 100_000, min_replicas=2)
            assert copies(client, "/g") == [2]
            with pytest.raises(CannotPlace, match="need 3 nodes"):
                client.put_parts("/h", [b"z" * 100_000], min_replicas=3)
            lenient = connect(cluster.url, min_replicas=1)  # the file's setting wins
            with lenient, pytest.raises(CannotPlace, match="need 3 nodes"):
                lenient.put("/h", b"z" * 100_000, min_replicas=3)
    finally:
        cluster.close()


@contextmanager
def _tmpfs(where: Path, size: str) -> Iterator[Path]:
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip("needs root to mount a small tmpfs")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def test_full_nodes_refuse_a_write_at_once_saying_so(tmp_path: Path) -> None:
    # Every disk smaller than the space a node keeps free: no node may take a chunk.
    with _tmpfs(tmp_path / "small", "32m") as root:
        cluster = LocalCluster(root, nodes=3)
        try:
            with connect(cluster.url) as client:
                started = time.monotonic()
                with pytest.raises(NoSpace) as caught:
                    client.put("/f", os.urandom(MiB))
                took = time.monotonic() - started
                print(f"refusal took {took:.3f} s")
                assert took < 1.0
                assert not isinstance(caught.value, ConnectionError)
                message = str(caught.value)
                assert "3 full" in message, message
                assert all(_node_id(cluster, i) in message for i in range(3)), message
            status = _status(cluster.url).stdout
            assert status.count("FULL: under 64 MiB free, takes no new chunks") == 3, status
        finally:
            cluster.close()


def test_a_stopped_metadata_service_fails_after_the_timeout_saying_it_retried(
    cluster3: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    with connect(cluster3.url, timeout=2.0) as client:
        client.put("/f", b"data")
        cluster3.meta.send_signal(signal.SIGKILL)
        cluster3.meta.wait()
        started = time.monotonic()
        with (
            caplog.at_level(logging.WARNING, logger="graben.client"),
            pytest.raises(Unavailable) as caught,
        ):
            client.stat("/f")
        took = time.monotonic() - started
        print(f"gave up after {took:.3f} s")
        assert 1.9 < took < 4.0
        assert "retrying for" in str(caught.value) and "cannot connect" in str(caught.value)
        assert any("retrying Stat until" in r.getMessage() for r in caplog.records)
    # a new client never reached it: it says so after --wait (1 s), not after --timeout
    cli = subprocess.run(
        [sys.executable, "-m", "graben.store.cli", "ls", "--timeout", "20", f"{cluster3.url}/"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert cli.returncode == 1
    assert "cannot reach the metadata service" in cli.stderr, cli.stderr
    assert "cannot connect" in cli.stderr and len(cli.stderr.splitlines()) == 1, cli.stderr


def test_a_dead_nodes_many_small_chunks_are_all_copied_again(tmp_path: Path) -> None:
    """Repair copies a batch of chunks at once and records them together: every file a
    lost node held gets its third copy back, and reads back whole."""
    cluster = LocalCluster(tmp_path, nodes=4, timeout=HEARTBEAT_TIMEOUT, repair=0.5)
    try:
        with connect(cluster.url, chunk_size=MiB, inline_max=0) as client:  # all on nodes
            files = {f"/small/{i}": os.urandom(4096 + i) for i in range(300)}
            files["/big"] = os.urandom(6 * MiB + 5)
            for path, data in files.items():
                client.put(path, data)
            cluster.kill(2)
            _wait_alive(client, 3)
            for path in files:
                eventually(lambda path=path: set(copies(client, path)) == {3}, 60.0)
            for path, data in files.items():
                assert client.get(path) == data, path
            eventually(lambda: _status(cluster.url, "--json").returncode == 0)
    finally:
        cluster.close()
