"""fsck with a data node dead checks the rest and names the dead one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cluster_kit import LocalCluster, eventually

from graben.store import connect


def test_fsck_checks_the_live_nodes_and_names_the_dead_one(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, 3, replication=2, timeout=2.0) as cluster:
        with connect(cluster.url) as client:
            for i in range(6):
                client.put(f"/f{i}", bytes([i]) * 100_000)
            dead = next(n for n in client.health().nodes if n.address == cluster.addresses[2])
            cluster.kill(2)
            eventually(lambda: not any(n.alive for n in client.health().nodes if n.id == dead.id))
            report = client.fsck()
        said = subprocess.run(
            [sys.executable, "-m", "graben.store.cli", "fsck", "--store", cluster.url],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
    kinds = {p.kind for p in report.problems}
    assert kinds == {"unreachable"}, report.problems
    [problem] = report.problems
    assert problem.where == f"{dead.id}@{dead.address}"
    assert f"data node {dead.id} is dead (no heartbeat for " in problem.detail
    assert ": 0 copies" not in problem.detail and report.chunks == 6 and not report.ok
    assert said.returncode == 1, said
    assert "INCOMPLETE: 1 unreachable" in said.stdout and dead.id in said.stdout, said.stdout
    assert "Traceback" not in said.stderr, said.stderr


def test_fsck_leaves_a_node_that_stops_answering_and_names_it(tmp_path: Path) -> None:
    """Killed, but not yet dead by the heartbeat timeout: its reads fail, not the run."""
    with LocalCluster(tmp_path, 3, replication=2) as cluster, connect(cluster.url) as client:
        for i in range(6):
            client.put(f"/f{i}", bytes([i]) * 100_000)
        gone = next(n for n in client.health().nodes if n.address == cluster.addresses[2])
        cluster.kill(2)
        report = client.fsck()
    [problem] = report.problems
    assert problem.kind == "unreachable" and problem.where == f"{gone.id}@{gone.address}"
    assert f"data node {gone.id} is not answering (" in problem.detail, problem.detail
    assert report.chunks == 6 and not report.ok
