"""The cluster under failure: real processes, kill -9, corrupted copies, garbage on the ports."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_kit import LocalCluster

from graben.store import _loop, connect
from graben.store._types import GetLayout

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


def test_a_corrupt_copy_is_skipped_and_reported_by_fsck(cluster4: LocalCluster) -> None:
    data = os.urandom(3 * MiB)
    with connect(cluster4.url) as client:
        client.put("/f", data)
        holders = [i for i in range(4) if cluster4.chunk_files(i)]
        assert len(holders) == 3
        victim = cluster4.chunk_files(holders[0])[0]
        with open(victim, "r+b") as f:
            f.seek(1000)
            f.write(b"\x00\xff\x00\xff")
        assert client.get("/f") == data  # served from a good replica
        report = client.fsck()
        [problem] = report.problems
        assert problem.kind == "corrupt" and problem.paths == ("/f",)
        assert victim.name in problem.where


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
