"""Rebalancing: new, empty nodes take copies from loaded ones at the set pace."""

from __future__ import annotations

import os
import time
from pathlib import Path

from cluster_kit import LocalCluster, copies, eventually

from graben.store import connect

KiB, MiB = 1 << 10, 1 << 20
RATE = 2 * MiB


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:  # moved away meanwhile
        return 0


def _loads(cluster: LocalCluster) -> list[int]:
    """Bytes of chunk files in each node's directory."""
    return [sum(map(_size, cluster.chunk_files(i))) for i in range(6)]


def _within(loads: list[int], band: float) -> bool:
    mean = sum(loads) / len(loads)
    return all(abs(load - mean) <= band * mean for load in loads)


def test_three_empty_nodes_take_their_share_of_three_loaded_ones_at_the_rate(
    tmp_path: Path,
) -> None:
    with LocalCluster(tmp_path, 3, timeout=5.0, repair=0.3, rebalance=RATE) as cluster:
        written = {f"/f{i}": os.urandom(200 * KiB) for i in range(24)}
        with connect(cluster.url, chunk_size=64 * KiB) as client:
            for path, data in written.items():
                client.put(path, data)
            before = _loads(cluster)
            assert before[0] > 4 * MiB
            started = time.monotonic()
            for i in range(3, 6):
                cluster.start_node(i)
            eventually(lambda: _within(_loads(cluster), 0.15), 60)
            took = time.monotonic() - started
            after = _loads(cluster)
            moved = sum(after[3:])
            print(f"loads before {before[:3]}, after {after}: {moved} bytes in {took:.1f} s")
            assert took >= 0.7 * moved / RATE  # the pace held
            assert sum(after) == sum(before)  # moved, not copied: nothing left behind
            for path, data in written.items():
                assert client.get(path) == data
                assert set(copies(client, path)) == {3}
            # A move may still be under way (the loads are within 15%, not equal): fsck
            # takes the metadata, then the nodes' files, so one copy moving between the two
            # reads looks missing. A copy truly lost stays missing.
            eventually(lambda: client.fsck().ok, 10)
