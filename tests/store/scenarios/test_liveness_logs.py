"""The leading metadata service logs a data node going dead and coming back, once each."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from cluster_kit import LocalCluster, eventually


def test_a_node_going_dead_and_coming_back_is_logged_once_each(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    said: list[str] = []

    def heard(words: str, times: int = 1) -> bool:
        said.append(capfd.readouterr().err)
        return "".join(said).count(words) >= times

    with LocalCluster(tmp_path, 2, replication=2, timeout=2.5, repair=0.2) as cluster:
        cluster.kill(1)
        eventually(lambda: heard(" is dead: no heartbeat for "), 20)
        time.sleep(1)  # rounds of the leader's duties, every 0.2 s: said once, not each round
        cluster.start_node(1)
        eventually(lambda: heard(" is back: it heartbeats again"), 20)
        time.sleep(1)
        heard("")
    log = "".join(said)
    assert log.count(" is dead: ") == 1 and log.count(" is back: ") == 1, log
    dead = next(line for line in log.splitlines() if " is dead: " in line)
    assert "WARNING graben.meta: data node " in dead and "(127.0.0.1:" in dead, dead
    assert "rack rack1" in dead and "timeout 2.5 s" in dead, dead
