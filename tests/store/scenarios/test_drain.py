"""Draining a data node under a writer, then SIGKILLing and removing it: real servers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_kit import LocalCluster, alive, copies, eventually

from graben.store import Client, NotFound, Refused, connect
from graben.store.client import _loop
from graben.store.transport._requests import GetLayout

KiB = 1 << 10
HEARTBEAT_TIMEOUT = 5.0


def _node_id(cluster: LocalCluster, i: int) -> str:
    return (cluster.node_dir(i) / "node-id").read_text().strip()


def _holder(client: Client, path: str) -> str:
    """The one node holding the first chunk of ``path`` (written with replication 1)."""
    layout = _loop.run(client.aio.meta.request(GetLayout(path)))
    (held,) = layout.replicas[layout.extents[0].chunk.id]
    return held


def _state(client: Client, node: str) -> tuple[str, int]:
    (found,) = [n for n in client.health().nodes if n.id == node]
    return found.state, found.held


def _graben(url: str, *argv: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "graben.store.cli", *argv, "--store", url]
    return subprocess.run(command, capture_output=True, text=True, check=False, timeout=60)


@pytest.fixture
def cluster4(tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path, nodes=4, timeout=HEARTBEAT_TIMEOUT, repair=0.3)
    with cluster:
        yield cluster


def test_a_node_drained_under_a_writer_can_be_killed_and_removed_with_every_byte_whole(
    cluster4: LocalCluster,
) -> None:
    ids = [_node_id(cluster4, i) for i in range(4)]
    written: dict[str, bytes] = {}
    with connect(cluster4.url, chunk_size=64 * KiB) as client:
        for i in range(8):
            written[f"/before/{i}"] = os.urandom(200 * KiB)
            client.put(f"/before/{i}", written[f"/before/{i}"])
        for i in range(6):  # one copy each: the drained node may hold the only one
            written[f"/solo/{i}"] = os.urandom(64 * KiB + 1)
            client.put(f"/solo/{i}", written[f"/solo/{i}"], replication=1)
        solo = [_holder(client, f"/solo/{i}") for i in range(6)]
        target = max(ids, key=solo.count)  # the node with the most sole copies
        assert solo.count(target) >= 1
        other = next(n for n in ids if n != target and n in solo)
        assert _state(client, target)[1] > 0

        stop, failed = threading.Event(), list[BaseException]()

        def writer() -> None:
            try:
                with connect(cluster4.url, chunk_size=64 * KiB) as own:
                    n = 0
                    while not stop.is_set():
                        data = os.urandom(150 * KiB)
                        own.put(f"/during/{n}", data)
                        written[f"/during/{n}"] = data
                        n += 1
            except BaseException as exc:
                failed.append(exc)

        thread = threading.Thread(target=writer)
        thread.start()
        try:
            drained = _graben(cluster4.url, "node", "drain", target)
            assert drained.returncode == 0, drained.stderr
            assert "draining" in drained.stdout
            eventually(lambda: _state(client, target)[0] == "drained", 60)
        finally:
            stop.set()
            thread.join(30)
        assert not failed, failed
        during = [p for p in written if p.startswith("/during/")]
        print(f"{len(during)} files written while draining")
        assert during
        text = _graben(cluster4.url, "status")
        assert "drained: may be stopped and removed" in text.stdout, text.stdout
        refused = _graben(cluster4.url, "node", "rm", target)
        assert refused.returncode != 0 and "still running" in refused.stderr

        cluster4.kill(ids.index(target))
        eventually(lambda: alive(client) == 3, 30)
        client.remove_node(target)
        assert target not in {n.id for n in client.health().nodes}
        with pytest.raises(NotFound):
            client.drain_node(target)
        for path, data in written.items():
            assert client.get(path) == data, path
            want = 1 if path.startswith("/solo/") else 3
            assert copies(client, path) == [want] * len(copies(client, path)), path
        report = client.fsck()
        assert report.ok, report

        cluster4.kill(ids.index(other))  # holds the only copy of a /solo file
        eventually(lambda: alive(client) == 2, 30)
        with pytest.raises(Refused, match="only copy"):
            client.remove_node(other)


def test_a_drained_node_s_erasure_coded_pieces_are_made_again_elsewhere(tmp_path: Path) -> None:
    data = os.urandom(6 * 64 * KiB + 1000)
    cluster = LocalCluster(tmp_path, nodes=5, timeout=HEARTBEAT_TIMEOUT, repair=0.3)
    with cluster, connect(cluster.url, chunk_size=64 * KiB) as client:
        client.mkdir("/ds")
        client.set_class("/ds", "ec:2+1")
        client.put("/ds/f", data)

        def striped() -> bool:
            state = client.storage_class("/ds/f")
            return state.chunks > 0 and state.converted == state.chunks

        eventually(striped, 30)
        held = Counter(n for s in client.layout("/ds/f").stripes.values() for n in s.nodes)
        target, pieces = held.most_common(1)[0]
        assert _state(client, target) == ("", pieces)
        client.drain_node(target)
        eventually(lambda: _state(client, target)[0] == "drained", 60)
        stripes = client.layout("/ds/f").stripes.values()
        assert all(target not in s.nodes and len(set(s.nodes)) == 3 for s in stripes)
        ids = [_node_id(cluster, i) for i in range(5)]
        cluster.kill(ids.index(target))
        eventually(lambda: alive(client) == 4, 30)
        client.remove_node(target)
        assert client.get("/ds/f") == data
        report = client.fsck()
        assert report.ok, report


def test_a_drain_goes_on_while_another_node_hangs(cluster4: LocalCluster) -> None:
    """A node SIGSTOPped mid-drain holds the leader's rounds up no longer than a call's
    bound (``NODE_CALL_S``, 15 s), not the minute a call may take: the drain ends while
    that node is still stopped, and every byte reads back once it runs again."""
    ids = [_node_id(cluster4, i) for i in range(4)]
    written = {f"/f{i}": os.urandom(200 * KiB) for i in range(12)}
    with connect(cluster4.url, chunk_size=64 * KiB) as client:
        for path, data in written.items():
            client.put(path, data, replication=2)
        held = Counter(n for p in written for n in _holders(client, p))
        target, hung = (n for n, _ in held.most_common(2))
        hung_proc = cluster4.nodes[ids.index(hung)]
        drained = _graben(cluster4.url, "node", "drain", target)
        assert drained.returncode == 0, drained.stderr
        hung_proc.send_signal(signal.SIGSTOP)
        try:
            took = eventually(lambda: _state(client, target)[0] == "drained", 45)
        finally:
            hung_proc.send_signal(signal.SIGCONT)
        print(f"drained in {took:.1f} s with a node stopped")
        for path, data in written.items():
            assert client.get(path) == data, path


def _holders(client: Client, path: str) -> set[str]:
    layout = _loop.run(client.aio.meta.request(GetLayout(path)))
    return {n for e in layout.extents for n in layout.replicas[e.chunk.id]}


def test_a_node_is_named_as_status_shows_it_or_by_its_address(cluster4: LocalCluster) -> None:
    """``status`` shows 12 characters of an id: drain takes them, or the address."""
    full = _node_id(cluster4, 1)
    with connect(cluster4.url) as client:
        (address,) = [n.address for n in client.health().nodes if n.id == full]
    drained = _graben(cluster4.url, "node", "drain", full[:12])
    assert drained.returncode == 0 and f"node {full}: drained" in drained.stdout, drained
    undone = _graben(cluster4.url, "node", "drain", address, "--undo")
    assert undone.returncode == 0 and f"node {full}: in service" in undone.stdout, undone
    vague = _graben(cluster4.url, "node", "drain", "")
    assert vague.returncode != 0 and "name a data node" in vague.stderr
    unknown = _graben(cluster4.url, "node", "rm", "f" * 12)
    assert unknown.returncode != 0 and "no data node" in unknown.stderr, unknown
