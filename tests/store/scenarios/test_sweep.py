"""Orphans go by themselves too: the leader sweeps the chunk files no metadata names
(a killed writer's, a copy a node held while down) once they are older than the grace,
and deletes nothing where the nodes' files look like another metadata's."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster_kit import LocalCluster, eventually, scrape, sum_of
from collect_kit import plant_orphans
from ranks_kit import free_port

from graben.store import IntegrityError, connect
from graben.store.client import AsyncClient

DAY = 86400.0
KiB = 1 << 10


def test_old_orphans_go_and_young_ones_stay(tmp_path: Path) -> None:
    """A chunk file no metadata names goes once older than the grace (by default a day,
    a writer's receipt life: no commit can name it any more); a younger one stays, and
    so does every file's chunk."""
    port = free_port()
    meta_args = ("--metrics", f"127.0.0.1:{port}", "--orphan-grace", "40")
    with LocalCluster(tmp_path, nodes=3, repair=0.3, meta_args=meta_args) as cluster:
        data = os.urandom(300 * KiB)
        with connect(cluster.url, chunk_size=64 * KiB) as client:
            client.put("/kept", data)
        old = plant_orphans(cluster.node_dir(0), 3, 2 * DAY, tag=1)
        young = plant_orphans(cluster.node_dir(0), 2, 0, tag=2)
        eventually(lambda: not any(p.exists() for p in old), 30)
        eventually(lambda: sum_of(scrape(port), "graben_sweep_deleted_chunks_total") == 3)
        assert all(p.exists() for p in young)
        with connect(cluster.url) as client:
            assert client.get("/kept") == data
            assert client.fsck().ok


def test_a_killed_writers_chunk_files_go_after_the_grace(tmp_path: Path) -> None:
    """A writer SIGKILLed mid-upload leaves chunk files no commit names: the leader
    deletes them once ``--orphan-grace`` has passed, and fsck then finds no orphan."""
    meta_args = ("--orphan-grace", "2")
    with LocalCluster(tmp_path, nodes=3, repair=0.3, meta_args=meta_args) as cluster:
        with subprocess.Popen(
            [sys.executable, "-c", _SLOW_WRITER, cluster.url], stdout=subprocess.PIPE
        ) as writer:
            try:
                assert writer.stdout is not None and writer.stdout.readline() == b"staged\n"
            finally:
                writer.send_signal(signal.SIGKILL)
        left = [p for i in range(3) for p in cluster.chunk_files(i)]
        assert left, "the writer left no chunk file: nothing tested"
        eventually(lambda: not any(p.exists() for p in left), 30)
        with connect(cluster.url) as client:
            assert not [p for p in client.fsck().problems if p.kind == "orphan"]


_SLOW_WRITER = """
import asyncio, os, sys
from graben.store.client import AsyncClient

async def main():
    async with AsyncClient(sys.argv[1], chunk_size=64 * 1024) as client:
        await client.stage_parts("/never", [os.urandom(640 * 1024)])
        print("staged", flush=True)
        await asyncio.sleep(3600)  # killed here, before any commit

asyncio.run(main())
"""


def test_a_commit_after_the_sweep_took_its_chunks_fails_and_loses_nothing(
    tmp_path: Path,
) -> None:
    """An upload slower than the grace: its chunk files are swept, and its commit is
    refused ("write the file again") rather than name bytes that are gone."""
    meta_args = ("--orphan-grace", "1")
    with LocalCluster(tmp_path, nodes=3, repair=0.2, meta_args=meta_args) as cluster:

        async def slow_upload() -> str:
            async with AsyncClient(cluster.url, chunk_size=64 * KiB) as client:
                upload, _ = await client.stage_parts("/slow", [os.urandom(256 * KiB)])
                files = [p for i in range(3) for p in cluster.chunk_files(i)]
                await asyncio.to_thread(eventually, lambda: not any(p.exists() for p in files), 30)
                try:
                    await client.commit_uploads([upload])
                except IntegrityError as exc:
                    return exc.message
                return "committed: " + repr(await client.get("/slow"))[:40]

        said = asyncio.run(slow_upload())
        assert "write the file again" in said, said
        with connect(cluster.url) as client, pytest.raises(FileNotFoundError):
            client.stat("/slow")


def test_a_node_full_of_unknown_chunk_files_is_not_swept(tmp_path: Path) -> None:
    """Far more orphans than crashed writers leave is what a wrong or old metadata
    database looks like: the sweep deletes none of them (fsck --collect --force does)."""
    with LocalCluster(tmp_path, nodes=3, repair=0.2, meta_args=("--orphan-grace", "1")) as cluster:
        with connect(cluster.url, inline_max=0) as client:
            client.put("/small", b"small" * 100)
        many = plant_orphans(cluster.node_dir(0), 100, 2 * DAY, tag=3)
        few = plant_orphans(cluster.node_dir(1), 2, 2 * DAY, tag=4)
        eventually(lambda: not any(p.exists() for p in few), 30)  # a pass has ended
        time.sleep(2)  # node 0's pass too, at the same pace
        assert all(p.exists() for p in many)
        with connect(cluster.url) as client:
            assert client.fsck(collect=True, force=True, grace=0).collected >= 100
            assert client.get("/small") == b"small" * 100
        assert not any(p.exists() for p in many)
