"""Space comes back by itself: the leader collects the chunks no file uses any more, with
no command, and never one a new upload or commit of the same bytes names meanwhile."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_kit import LocalCluster, eventually, scrape, sum_of
from collect_kit import GRABEN, graben_json, node_bytes, physical, seconds_until_within
from ranks_kit import free_port

from graben.store import connect

MiB = 1 << 20
GRACE = 2.0
ROUND = 0.5


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[LocalCluster, int]]:
    port = free_port()
    cluster = LocalCluster(
        tmp_path,
        nodes=3,
        repair=ROUND,
        meta_args=("--collect-grace", str(GRACE), "--metrics", f"127.0.0.1:{port}"),
    )
    try:
        yield cluster, port
    finally:
        cluster.close()


def test_rm_r_of_a_tree_comes_back_within_the_grace_and_a_round(
    cluster: tuple[LocalCluster, int],
) -> None:
    local, port = cluster
    with connect(local.url) as client:
        for i in range(16):  # 64 MiB in 4 MiB files
            client.put(f"/tree/{i // 4}/f{i}", os.urandom(4 * MiB))
        client.put("/kept", os.urandom(3 * MiB))
    held = node_bytes(local, 3)
    assert held >= 3 * 67 * MiB
    rm = subprocess.run(
        [*GRABEN, "rm", "-r", "--store", local.url, "/tree"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert rm.returncode == 0, rm.stderr
    waiting = graben_json("status", "--store", local.url)["collection"]
    assert waiting["waiting"] == 16 and waiting["waiting_bytes"] == 3 * 64 * MiB  # type: ignore[index]
    took = seconds_until_within(local, 3, local.url)
    assert took < GRACE + ROUND + 3.0, took  # what a loaded 2-core machine adds to a round
    assert node_bytes(local, 3) == physical(local.url) == 3 * 3 * MiB
    state = graben_json("status", "--store", local.url)["collection"]
    assert state == {  # type: ignore[comparison-overlap]
        "waiting": 0,
        "waiting_bytes": 0,
        "freed": 16,
        "freed_bytes": 3 * 64 * MiB,
        "grace_s": GRACE,
    }
    metrics = scrape(port)
    assert sum_of(metrics, r"graben_collect_freed_bytes_total") == 3 * 64 * MiB
    assert sum_of(metrics, r"graben_collect_waiting_chunks") == 0
    report = graben_json("fsck", "--store", local.url)
    assert report["ok"] and report["problems"] == []
    assert report["collection"]["freed"] == 16  # type: ignore[index]
    with connect(local.url) as client:
        assert len(client.get("/kept")) == 3 * MiB


def test_the_status_line_says_what_waits_and_what_was_freed(
    cluster: tuple[LocalCluster, int],
) -> None:
    local, _ = cluster
    with connect(local.url) as client:
        client.put("/a", os.urandom(2 * MiB))
        client.rm("/a")
    status = subprocess.run(
        [*GRABEN, "status", "--store", local.url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "collection: 1 chunks no file uses (6.0 MiB on nodes)" in status.stdout
    assert f"the leader collects each {GRACE:g} s after its last use" in status.stdout
    eventually(lambda: node_bytes(local, 3) == 0, GRACE + 10)
    fsck = subprocess.run(
        [*GRABEN, "fsck", "--store", local.url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "collection: 0 chunks no file uses" in fsck.stdout
    assert "1 chunks (6.0 MiB) freed so far" in fsck.stdout


def test_identical_bytes_uploaded_again_while_the_leader_collects_them_all_read_back(
    tmp_path: Path,
) -> None:
    """The leader collects every 20 ms whatever no file uses (no grace): each round a file
    is removed and the same bytes are written again at once, so an upload of them meets
    the collection of their old copies (the nodes' count of copies kept for being written
    again says how often). Every file written reads back whole, and fsck finds all
    copies."""
    port = free_port()
    local = LocalCluster(
        tmp_path,
        nodes=3,
        repair=0.02,
        meta_args=("--collect-grace", "0", "--metrics", f"127.0.0.1:{port}"),
    )
    errors: list[BaseException] = []
    try:
        with connect(local.url, chunk_size=64 * 1024) as client:

            def writer(w: int) -> None:
                blobs = [os.urandom(512 * 1024) for _ in range(10)]
                try:
                    for round_ in range(40):
                        data = blobs[round_ // 4]
                        client.put(f"/w{w}/old", data)
                        client.rm(f"/w{w}/old")
                        client.put(f"/w{w}/new{round_}", data)
                        assert client.get(f"/w{w}/new{round_}") == data
                        if round_ % 4 != 3:
                            client.rm(f"/w{w}/new{round_}")
                except BaseException as exc:  # the test fails with it
                    errors.append(exc)

            threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=300)
            assert not errors, errors
            time.sleep(0.5)  # a round or more: nothing left to collect that is still used
            for w in range(3):
                for round_ in range(3, 40, 4):
                    assert len(client.get(f"/w{w}/new{round_}")) == 512 * 1024
            report = client.fsck()
            assert report.ok, [p for p in report.problems if p.kind != "orphan"]
        met = sum_of(scrape(port), r"graben_collect_kept_copies_total")
        assert met > 0, "no upload met a collection of its bytes: the test proved nothing"
    finally:
        local.close()


def test_a_node_down_while_its_copies_were_collected_gets_its_space_back_on_return(
    cluster: tuple[LocalCluster, int],
) -> None:
    """Collection cannot delete the copies on a node that is down; it deletes them once
    the node heartbeats again (not a day later, by the orphan sweep)."""
    local, _ = cluster
    with connect(local.url, chunk_size=MiB) as client:
        client.put("/gone", os.urandom(4 * MiB))
        held = local.chunk_files(2)
        assert len(held) == 4
        local.kill(2)
        client.rm("/gone")
        eventually(lambda: not local.chunk_files(0) and not local.chunk_files(1), 60)
        assert all(p.exists() for p in held)  # down: not deleted
        local.start_node(2)
        eventually(lambda: not any(p.exists() for p in held), 60)
