"""The cluster under failure: real processes, kill -9, corrupted copies, garbage on the ports."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_kit import LocalCluster, eventually

from graben.store import Client, NoSpace, Unavailable, connect
from graben.store._hashing import chunk_ref
from graben.store.client import _loop
from graben.store.transport._requests import GetLayout, ListNodes

MiB = 1 << 20


@pytest.fixture
def cluster4(tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path, nodes=4)
    try:
        yield cluster
    finally:
        cluster.close()


def test_kill_9_a_node_during_an_rf3_write_of_256_mib(cluster4: LocalCluster) -> None:
    block = 8 * MiB
    blocks = [os.urandom(block) for _ in range(32)]  # 256 MiB
    digest = hashlib.sha256(b"".join(blocks)).hexdigest()
    with connect(cluster4.url) as client:
        with client.open("/ckpt/model.bin", "wb") as f:
            for i, data in enumerate(blocks):
                if i == 8:
                    time.sleep(1.0)  # let the first 8 chunks land (some of them on node 1)
                if i == 10:
                    cluster4.kill(1)  # mid-write, with chunks in flight to it
                f.write(data)
        info = client.stat("/ckpt/model.bin")
        assert (info.size, info.replication) == (256 * MiB, 3)
        layout = _loop.run(client.aio.meta.request(GetLayout("/ckpt/model.bin")))
        dead = (cluster4.node_dir(1) / "node-id").read_text().strip()
        copies = [layout.replicas[x.chunk.id] for x in layout.extents]
        assert all(len(set(c)) == 3 for c in copies)
        assert any(dead in c for c in copies[:8])  # it was taking writes before it died
        assert not any(dead in c for c in copies[16:])  # and was replaced after
        read = hashlib.sha256()
        with client.open("/ckpt/model.bin") as r:
            while piece := r.read(block):
                read.update(piece)
        assert read.hexdigest() == digest


def test_kill_9_a_node_during_a_read(cluster4: LocalCluster) -> None:
    data = os.urandom(96 * MiB)
    with connect(cluster4.url) as client:
        client.put("/data/shard", data)
        out = bytearray()
        with client.open("/data/shard") as r:
            out += r.read(16 * MiB)
            cluster4.kill(0)
            cluster4.kill(2)  # two of four: every chunk keeps at least one copy
            while piece := r.read(8 * MiB):
                out += piece
        assert out == data


def test_fsck_reports_a_corrupt_copy_and_reads_skip_it(cluster4: LocalCluster) -> None:
    data = os.urandom(3 * MiB)
    with connect(cluster4.url) as client:
        client.put("/f", data)
        holders = [i for i in range(4) if cluster4.chunk_files(i)]
        assert len(holders) == 3
        victim = cluster4.chunk_files(holders[0])[0]
        with open(victim, "r+b") as f:
            f.seek(1000)
            f.write(b"\x00\xff\x00\xff")
        report = client.fsck()
        [problem] = report.problems
        assert problem.kind == "corrupt" and problem.paths == ("/f",)
        assert victim.name in problem.where
        assert client.get("/f") == data  # served from a good replica


def test_garbage_on_every_port_never_crashes_a_server(cluster4: LocalCluster) -> None:
    for address in [cluster4.meta_address, *cluster4.addresses]:
        host, _, port = address.rpartition(":")
        for garbage in (os.urandom(10_000), b"GET / HTTP/1.1\r\n\r\n", b"GRB1" + os.urandom(12)):
            with socket.create_connection((host, int(port)), timeout=5) as sock:
                sock.sendall(garbage)
                sock.settimeout(5)
                try:
                    while sock.recv(65536):
                        pass
                except (ConnectionResetError, TimeoutError):
                    pass
    with connect(cluster4.url) as client:  # everyone still serves
        client.put("/after", b"still fine")
        assert client.get("/after") == b"still fine"
    assert all(p.poll() is None for p in [cluster4.meta, *cluster4.nodes])


def test_many_concurrent_writers(cluster4: LocalCluster) -> None:
    errors: list[BaseException] = []
    with connect(cluster4.url) as client:

        def work(i: int) -> None:
            try:
                for j in range(10):
                    client.put(f"/w/{i}/{j}", bytes([i, j]) * 1000)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert client.du("/w") == (160, 160 * 2000)


def _live_copies(client: Client, path: str) -> list[int]:
    layout = _loop.run(client.aio.meta.request(GetLayout(path)))
    alive = {n.id for n in _loop.run(client.aio.meta.request(ListNodes())) if n.alive}
    return [len(set(layout.replicas[x.chunk.id]) & alive) for x in layout.extents]


def _node_id(cluster: LocalCluster, i: int) -> str:
    return (cluster.node_dir(i) / "node-id").read_text().strip()


def test_a_dead_nodes_chunks_return_to_three_copies(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, nodes=4, timeout=2.0, repair=0.5)
    try:
        with connect(cluster.url) as client:
            data = os.urandom(20 * MiB)
            client.put("/f", data)
            holder = next(i for i in range(4) if cluster.chunk_files(i))
            cluster.kill(holder)
            eventually(lambda: _live_copies(client, "/f") == [3, 3, 3])
            assert client.get("/f") == data
    finally:
        cluster.close()


def test_a_corrupt_copy_found_by_a_reader_is_repaired(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, nodes=4, repair=0.5)
    try:
        with connect(cluster.url) as client:
            data = os.urandom(MiB)
            client.put("/f", data)
            layout = _loop.run(client.aio.meta.request(GetLayout("/f")))
            first = layout.replicas[layout.extents[0].chunk.id][0]  # the copy readers try first
            holder = next(i for i in range(4) if _node_id(cluster, i) == first)
            [victim] = cluster.chunk_files(holder)
            victim.write_bytes(b"rot" + victim.read_bytes()[3:])
            assert client.get("/f") == data  # good copy served, bad one reported
            eventually(lambda: _live_copies(client, "/f") == [3] and client.fsck().ok)
            assert not client.fsck().problems
    finally:
        cluster.close()


def test_the_scrubber_finds_rot_nobody_reads(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, nodes=4, repair=0.5, scrub=0.5)
    try:
        with connect(cluster.url) as client:
            client.put("/cold", os.urandom(MiB))
            holder = next(i for i in range(4) if cluster.chunk_files(i))
            [victim] = cluster.chunk_files(holder)
            victim.write_bytes(b"rot" + victim.read_bytes()[3:])
            eventually(lambda: _live_copies(client, "/cold") == [3] and not client.fsck().problems)
    finally:
        cluster.close()


def test_status_shows_nodes_and_health(cluster4: LocalCluster) -> None:
    import json
    import subprocess
    import sys

    def status() -> tuple[int, dict[str, object]]:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "graben.store.cli",
                "status",
                "--store",
                cluster4.url,
                "--json",
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        return done.returncode, json.loads(done.stdout)

    with connect(cluster4.url) as client:
        client.put("/f", os.urandom(MiB))
    code, health = status()
    assert code == 0
    assert health["degraded"] == 0 and health["replication"] == 3
    nodes = health["nodes"]
    assert isinstance(nodes, list) and len(nodes) == 4
    assert all(n["alive"] and n["total"] > 0 for n in nodes)


def test_a_write_rides_out_a_metadata_service_restart(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, nodes=3)
    try:
        blocks = [os.urandom(8 * MiB) for _ in range(16)]
        with connect(cluster.url) as client:
            with client.open("/big", "wb") as f:
                for i, data in enumerate(blocks):
                    if i == 6:
                        cluster.restart_meta(down_s=0.5)  # kill -9 mid-write, back shortly
                    f.write(data)
            assert client.get("/big") == b"".join(blocks)
    finally:
        cluster.close()


def test_a_commit_while_the_metadata_service_is_down_fails_cleanly(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, nodes=3)
    try:
        with connect(cluster.url, timeout=2.0) as client:
            client.put("/f", b"old version")
            f = client.open("/f", "wb")
            f.write(os.urandom(client.chunk_size))  # a whole chunk: uploaded now, not at close
            time.sleep(1.0)  # let it land; only the commit is left
            cluster.meta.send_signal(signal.SIGKILL)
            cluster.meta.wait()
            began = time.monotonic()
            with pytest.raises(Unavailable, match="gave up on Commit"):
                f.close()  # repeated (with its key) until the client's timeout, then refused
            assert time.monotonic() - began < 10
            cluster.restart_meta()
            assert client.get("/f") == b"old version"  # nothing half-committed
    finally:
        cluster.close()


@pytest.mark.parametrize("ahead", [0, 4])
def test_sequential_and_random_reads_with_remote_read_ahead(cluster_url: str, ahead: int) -> None:
    data = os.urandom(12 * MiB + 5)
    with connect(cluster_url, chunk_size=MiB, remote_read_ahead=ahead) as client:
        client.put(f"/ahead{ahead}", data)
        out = bytearray()
        with client.open(f"/ahead{ahead}") as f:
            while piece := f.read(MiB):
                out += piece
            assert out == data
            for start in (7 * MiB + 3, 2, 11 * MiB):  # jumps leave fetched chunks unused
                f.seek(start)
                assert f.read(MiB + 9) == data[start : start + MiB + 9]
        client.rm(f"/ahead{ahead}")


def test_a_node_with_a_full_disk_sends_its_chunks_elsewhere(tmp_path: Path) -> None:
    disk = tmp_path / "node0"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=200m", "tmpfs", str(disk)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip("needs root to mount a small tmpfs")
    try:
        cluster = LocalCluster(tmp_path, nodes=4)
        try:
            # Fill the disk behind the node's back: it still looks roomy to placement.
            with open(disk / "filler", "wb", buffering=0) as f, contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * MiB)
            data = os.urandom(64 * MiB)
            with connect(cluster.url) as client:
                client.put("/f", data)
                layout = _loop.run(client.aio.meta.request(GetLayout("/f")))
                full = _node_id(cluster, 0)
                assert all(len(set(n)) == 3 for n in layout.replicas.values())
                assert not any(full in n for n in layout.replicas.values())
                assert client.get("/f") == data
                extra = os.urandom(MiB)  # and the node itself answers clearly
                with pytest.raises(NoSpace):
                    _loop.run(client.aio.chunks.write(full, chunk_ref(extra), memoryview(extra)))
        finally:
            cluster.close()
    finally:
        subprocess.run(["umount", str(disk)], check=False)
