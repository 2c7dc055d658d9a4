"""``graben status`` shows each node's graben bytes apart from its disk's free space, and
when its last full scrub pass ended."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from cluster_kit import LocalCluster, eventually

from graben.store import connect

MIB = 1 << 20


def test_status_shows_graben_bytes_free_space_and_the_last_scrub(tmp_path: Path) -> None:
    started = time.time()
    with LocalCluster(tmp_path, 2, replication=2, scrub=0.5) as cluster:
        with connect(cluster.url) as client:
            client.put("/a", os.urandom(3 * MIB))

            def counted() -> bool:
                nodes = client.health().nodes
                return all(n.stored >= 3 * MIB and n.scrubbed > started for n in nodes)

            eventually(counted, 20)
            nodes = client.health().nodes
        said = subprocess.run(
            [sys.executable, "-m", "graben.store.cli", "status", "--store", cluster.url],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
    for node in nodes:
        # The chunk files' own bytes, not the whole disk's use (the machine's other files)
        assert 3 * MIB <= node.stored < 3 * MIB + MIB // 2, node
        assert 0 < node.free < node.total and node.scrubbed < time.time()
    header = next(line for line in said.stdout.splitlines() if line.startswith("node "))
    assert header.split() == [
        *("node", "address", "rack", "state", "graben", "free", "total", "scrubbed")
    ]
    assert said.stdout.count(" 3.0 MiB ") == 2 and said.stdout.count(" s ago") == 2, said.stdout
