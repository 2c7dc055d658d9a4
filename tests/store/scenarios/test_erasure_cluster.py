"""Erasure-coded classes on real clusters: chunks converted in the background, every byte
back after any M nodes are SIGKILLed, repair making lost pieces again, damaged and forged
pieces caught, and a leader killed mid-conversion losing nothing."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from cluster_kit import LocalCluster, eventually

from graben.store import Client, IntegrityError, connect
from graben.store._hashing import content_id, crc32c
from graben.store._types import ChunkRef
from graben.store.client import _loop
from graben.store.transport import GetHealth, ListNodes

KiB = 1 << 10
HEARTBEAT_TIMEOUT = 4.0


def _striped(client: Client, path: str) -> bool:
    state = client.storage_class(path)
    return state.chunks > 0 and state.converted == state.chunks


def _alive(client: Client) -> set[str]:
    return {n.id for n in _loop.run(client.aio.meta.request(ListNodes())) if n.alive}


def _held_bytes(cluster: LocalCluster) -> int:
    return sum(p.stat().st_size for i in range(len(cluster.nodes)) for p in cluster.chunk_files(i))


@contextmanager
def _running(tmp_path: Path, nodes: int, metas: int = 1) -> Iterator[LocalCluster]:
    cluster = LocalCluster(
        tmp_path, nodes=nodes, timeout=HEARTBEAT_TIMEOUT, repair=0.3, metas=metas
    )
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def twelve(tmp_path: Path) -> Iterator[LocalCluster]:
    with _running(tmp_path, 12) as cluster:
        yield cluster


def test_six_plus_three_keeps_half_again_survives_any_three_dead_and_repairs(
    twelve: LocalCluster,
) -> None:
    data = os.urandom(8 * 256 * KiB + 1000)
    with connect(twelve.url, chunk_size=256 * KiB) as client:
        client.mkdir("/ds")
        client.set_class("/ds", "ec:6+3")
        client.put("/ds/f", data)
        eventually(lambda: _striped(client, "/ds/f"))
        # The copies go once the stripes are recorded: what is left on disk is the pieces.
        eventually(lambda: _held_bytes(twelve) <= 1.55 * len(data))
        assert _held_bytes(twelve) >= 1.5 * len(data)
        stripes = client.layout("/ds/f").stripes
        assert all(len(set(s.nodes)) == 9 for s in stripes.values())
    for i in (0, 5, 11):
        twelve.kill(i)
    with connect(twelve.url) as client:
        assert client.get("/ds/f") == data
        eventually(lambda: len(_alive(client)) == 9, 20)
        live = _alive(client)

        # Repair puts each lost piece on a live node that held none of that stripe.
        def repaired() -> bool:
            stripes = client.layout("/ds/f").stripes.values()
            return all(set(s.nodes) <= live and len(set(s.nodes)) == 9 for s in stripes)

        eventually(repaired)
    for i in (1, 2, 3):  # three more: only the pieces repair made stand in for them
        twelve.kill(i)
    with connect(twelve.url) as client:
        assert client.get("/ds/f") == data


@pytest.fixture
def three(tmp_path: Path) -> Iterator[LocalCluster]:
    with _running(tmp_path, 3) as cluster:
        yield cluster


def _piece_file(cluster: LocalCluster, piece: str) -> Path:
    for i in range(len(cluster.nodes)):
        for path in cluster.chunk_files(i):
            if path.name == piece:
                return path
    raise AssertionError(f"no node holds piece {piece}")


def test_two_plus_one_reads_past_a_flipped_piece_repairs_it_and_refuses_a_forged_one(
    three: LocalCluster,
) -> None:
    data = os.urandom(3 * 200 * KiB)
    with connect(three.url, chunk_size=200 * KiB) as client:
        client.put("/f", data)
        opened = client.open("/f")  # its layout names the copies
        client.set_class("/", "ec:2+1")
        eventually(lambda: _striped(client, "/f"))
        eventually(lambda: _held_bytes(three) <= 1.5 * len(data) + 1)  # copies deleted
        assert opened.read() == data  # finds the chunks where they went
        opened.close()
        stripe = next(iter(client.layout("/f").stripes.values()))
        piece = stripe.pieces[0]
        where = _piece_file(three, piece.id)
        damaged = bytearray(where.read_bytes())
        damaged[100] ^= 0x40
        where.chmod(0o600)
        where.write_bytes(bytes(damaged))
        report = client.fsck()
        assert [(p.kind, p.chunk) for p in report.problems] == [("corrupt", piece.id)]
        assert "/f" in report.problems[0].paths
    with connect(three.url) as client:
        assert client.get("/f") == data  # decoded from the other two pieces
        # Reported, deleted and made again from the others, byte for byte.
        eventually(
            lambda: (
                client.layout("/f").stripes[next(iter(client.layout("/f").stripes))].nodes[0] != ""
            )
        )
        eventually(lambda: _rebuilt(three, piece))
        assert client.fsck().problems == ()
        forged = os.urandom(piece.length)
        with pytest.raises(IntegrityError, match="do not hash"):
            node = stripe.nodes[1]
            _loop.run(
                client.aio.chunks.write(
                    node, ChunkRef(piece.id, len(forged), crc32c(forged)), memoryview(forged)
                )
            )
    three.kill(2)
    with connect(three.url) as client:
        assert client.get("/f") == data


def _rebuilt(cluster: LocalCluster, piece: ChunkRef) -> bool:
    try:
        return content_id(memoryview(_piece_file(cluster, piece.id).read_bytes())) == piece.id
    except AssertionError:
        return False


@pytest.fixture
def two_services(tmp_path: Path) -> Iterator[LocalCluster]:
    with _running(tmp_path, 3, metas=2) as cluster:
        yield cluster


def test_a_leader_killed_mid_conversion_loses_nothing_and_the_next_one_finishes(
    two_services: LocalCluster,
) -> None:
    cluster = two_services
    data = os.urandom(64 * 128 * KiB)
    failures: list[BaseException] = []
    with connect(cluster.url, chunk_size=128 * KiB) as client:
        client.put("/big", data)
        health = _loop.run(client.aio.meta.request(GetHealth()))
        leader = next(s.address for s in health.services if s.id == health.leader)
        client.set_class("/big", "ec:2+1")
        eventually(lambda: client.storage_class("/big").converted > 0, 30)
        before = client.storage_class("/big")
    # Killed with most chunks still to go (a round converts 16 of the 64).
    assert before.converted < before.chunks
    stop = threading.Event()

    def read_all_along() -> None:
        with connect(cluster.url) as reader:
            while not stop.is_set():
                try:
                    assert reader.get("/big") == data
                except BaseException as exc:
                    failures.append(exc)
                    return

    reading = threading.Thread(target=read_all_along)
    reading.start()
    try:
        cluster.kill_meta(cluster.meta_addresses.index(leader))
        with connect(cluster.url) as client:
            state = client.storage_class("/big")
            assert state.converted > 0  # what the dead leader recorded stands
            eventually(lambda: _striped(client, "/big"), 60)
            time.sleep(1.0)  # readers go on across the last conversions
    finally:
        stop.set()
        reading.join()
    assert failures == []
    with connect(cluster.url) as client:
        assert client.get("/big") == data
        report = client.fsck(collect=True, grace=0.0)
        assert [p for p in report.problems if p.kind in ("missing", "corrupt", "metadata")] == []
        assert client.fsck().problems == ()
