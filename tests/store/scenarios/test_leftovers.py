"""What writers leave behind and what disks keep back: temporaries, grace, the free-space reserve,
and who may read the files a store makes."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_kit import LocalCluster

from graben.store import NoSpace, connect
from graben.store._config import RESERVE
from graben.store._hashing import chunk_ref
from graben.store.client import _loop
from graben.store.transport import ChunkCall
from graben.store.wire._auth import grant, load_secret
from graben.store.wire._frames import encode
from graben.store.wire._rpc import Connection

GRABEN = (sys.executable, "-m", "graben.store.cli")
MiB = 1 << 20


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def _leave_temporaries(tmp: Path) -> tuple[Path, Path]:
    """What a killed writer leaves (two minutes old), and a live writer's file."""
    stale, fresh = tmp / f"{'ab' * 32}.123.dead", tmp / f"{'cd' * 32}.456.live"
    stale.write_bytes(os.urandom(3 * MiB))
    fresh.write_bytes(os.urandom(1000))
    _age(stale, 120)
    return stale, fresh


# -- temporaries and --grace ---------------------------------------------------------------


def test_fsck_shows_a_dead_writers_temporaries_and_collect_removes_them(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with connect(root) as client:
        client.put("/a", b"a" * 1000)
    stale, fresh = _leave_temporaries(root / "chunks" / "tmp")
    with connect(root, gc_grace_s=60) as client:
        report = client.fsck()
        assert report.ok
        [found] = [p for p in report.problems if p.kind == "temporary"]
        assert found.chunk == stale.name and str(stale) in found.where
        assert "3145728 bytes" in found.detail
        assert client.fsck(collect=True).collected == 1
    assert not stale.exists() and fresh.exists()  # the live writer's file stays


def test_cli_grace_collects_now_what_rm_freed(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with connect(root) as client:
        client.put("/big", os.urandom(2 * MiB))
        client.put("/kept", b"kept")
        client.rm("/big")
    stale, fresh = _leave_temporaries(root / "chunks" / "tmp")
    base = [*GRABEN, "fsck", "--store", str(root), "--collect"]
    later = subprocess.run(base, capture_output=True, text=True, timeout=60, check=False)
    assert later.returncode == 0 and "collected" not in later.stdout  # the hour's grace
    assert stale.exists()
    now = subprocess.run(
        [*base, "--grace", "0", "--json"], capture_output=True, text=True, timeout=60, check=False
    )
    assert now.returncode == 0, now.stderr
    assert '"collected": 3' in now.stdout  # the chunk rm freed, and both temporaries
    assert not stale.exists() and not fresh.exists()
    with connect(root) as client:
        assert client.get("/kept") == b"kept"
    bad = subprocess.run(
        [*base, "--grace", "-1"], capture_output=True, text=True, timeout=60, check=False
    )
    assert bad.returncode != 0 and "grace" in bad.stderr


def test_a_nodes_temporaries_are_shown_and_collected(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, nodes=3)
    try:
        with connect(cluster.url) as client:
            client.put("/a", b"a" * 1000)
        stale, fresh = _leave_temporaries(cluster.node_dir(1) / "chunks" / "tmp")
        with connect(cluster.url, gc_grace_s=60) as client:
            report = client.fsck()
            [found] = [p for p in report.problems if p.kind == "temporary"]
            assert found.chunk == stale.name and "3145728 bytes" in found.detail
            assert client.fsck(collect=True).collected == 1
        assert not stale.exists() and fresh.exists()
    finally:
        cluster.close()


# -- the free-space reserve -------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs with 20 MiB beyond the reserve, mounted where node 0 keeps its data."""
    disk = tmp_path / "c" / "node0"
    disk.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={RESERVE + 20 * MiB}", "tmpfs", str(disk)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip("needs root to mount a small tmpfs")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_a_node_keeps_its_reserve_counting_writes_in_flight(small_disk: Path) -> None:
    cluster = LocalCluster(small_disk.parent, nodes=1, replication=1)
    try:
        with connect(cluster.url) as client:
            health = client.health()
        (node,) = health.nodes
        blocks = [os.urandom(8 * MiB) for _ in range(6)]
        caps = [
            grant(load_secret(), chunk_ref(b).id, "write", 60, time.time(), store=health.store_id)
            for b in blocks
        ]

        async def write_all() -> list[BaseException | None]:
            host, _, port = node.address.rpartition(":")
            conn = await Connection.open(host, int(port))
            try:
                calls = [
                    conn.call(
                        "chunk.write", encode(ChunkCall(chunk_ref(b), c)), payload=memoryview(b)
                    )
                    for b, c in zip(blocks, caps, strict=True)
                ]
                results = await asyncio.gather(*calls, return_exceptions=True)
            finally:
                await conn.close()
            return [r if isinstance(r, BaseException) else None for r in results]

        outcomes = _loop.run(write_all())
        refused = [o for o in outcomes if o is not None]
        assert len(refused) == 4  # 20 MiB beyond the reserve: two 8 MiB chunks fit
        assert all(isinstance(o, NoSpace) for o in refused)
        assert node.id in str(refused[0]) and "reserve" in str(refused[0])
        free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
        assert free >= RESERVE
        assert not list((small_disk / "chunks" / "tmp").iterdir())  # nothing left half-written
    finally:
        cluster.close()


# -- permissions ------------------------------------------------------------------------------


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.usefixtures("umask_022")
def test_an_embedded_store_is_private_to_its_owner(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with connect(root) as client:
        client.put("/a", os.urandom(100_000))
        db = root / "meta.db"
        for path in (db, Path(f"{db}-wal"), Path(f"{db}-shm"), root / "store-id"):
            assert _mode(path) == 0o600, path
    assert _mode(root) == 0o700
    chunks = list((root / "chunks").rglob("*"))
    assert {_mode(p) for p in chunks if p.is_file()} == {0o600}
    assert {_mode(p) for p in chunks if p.is_dir()} | {_mode(root / "chunks")} == {0o700}


@pytest.mark.usefixtures("umask_022")
def test_a_clusters_files_are_private_to_their_owner(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, nodes=1, replication=1)
    try:
        with connect(cluster.url) as client:
            client.put("/a", os.urandom(100_000))
        db = tmp_path / "meta.db"
        for path in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
            assert _mode(path) == 0o600, path
        node = cluster.node_dir(0)
        assert _mode(node) == 0o700
        assert _mode(node / "node-id") == _mode(node / "store-id") == 0o600
        files = list((node / "chunks").rglob("*"))
        assert {_mode(p) for p in files if p.is_file()} == {0o600}
        assert {_mode(p) for p in files if p.is_dir()} == {0o700}
    finally:
        cluster.close()
