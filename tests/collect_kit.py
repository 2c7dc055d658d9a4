"""What the tests of collection measure on a cluster: the bytes its nodes' chunk files
take, the bytes ``graben du --physical`` counts, and the two brought within a margin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from cluster_kit import LocalCluster

GRABEN = (sys.executable, "-m", "graben.store.cli")


def graben_json(*argv: str) -> dict[str, object]:
    """A ``graben`` command's ``--json`` output (it must succeed)."""
    done = subprocess.run(
        [*GRABEN, *argv, "--json"], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode in (0, 1), done.stderr
    found: dict[str, object] = json.loads(done.stdout)
    return found


def node_bytes(cluster: LocalCluster, nodes: int) -> int:
    """Bytes of the chunk files on the nodes (their temporaries aside)."""
    return sum(
        _size(p) for i in range(nodes) for p in (cluster.node_dir(i) / "chunks").glob("??/??/*")
    )


def _size(path: Path) -> int:
    try:
        return path.stat().st_size if path.is_file() else 0
    except FileNotFoundError:  # collected as we looked
        return 0


def physical(url: str) -> int:
    """What ``graben du --physical /`` counts: every copy of every file's chunks."""
    return int(graben_json("du", "--physical", "--store", url, "/")["physical_bytes"])  # type: ignore[call-overload]


def seconds_until_within(
    cluster: LocalCluster, nodes: int, url: str, margin: float = 0.1, limit: float = 120.0
) -> float:
    """Seconds until the nodes' chunk bytes come within ``margin`` of ``du --physical``."""
    started = time.monotonic()
    want = physical(url)
    while node_bytes(cluster, nodes) > want * (1 + margin):
        assert time.monotonic() - started < limit, (node_bytes(cluster, nodes), want)
        time.sleep(0.1)
    return time.monotonic() - started


def plant_orphans(node_dir: Path, count: int, age_s: float, tag: int = 0) -> list[Path]:
    """``count`` chunk files no metadata names in a node's ``--data``, last written
    ``age_s`` ago (``tag`` tells the plantings of one test apart)."""
    planted = []
    then = time.time() - age_s
    for i in range(count):
        name = (f"{tag:02x}{i:04x}" * 11)[:64]
        path = node_dir / "chunks" / name[:2] / name[2:4] / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"orphan")
        os.utime(path, (then, then))
        planted.append(path)
    return planted
