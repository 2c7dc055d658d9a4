"""``graben cluster up`` tends its servers: a data node SIGKILLed is named on stderr with
its return code and serves again, restarted on its address."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster_kit import eventually

from graben.store import connect
from graben.store.local import stop
from graben.store.local._restarts import FIRST_S, LONGEST_S, STEADY_S, Backoff, exit_words

GRABEN = (sys.executable, "-m", "graben.store.cli")


def _children(pid: int) -> list[int]:
    found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(p) for p in found]


def _node_pid(up: int, data: Path) -> int:
    for pid in _children(up):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"node" in argv and str(data).encode() in argv:
            return pid
    raise AssertionError(f"no data node on {data} under pid {up}")


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="finds children in /proc")
def test_a_killed_node_is_named_and_restarted(tmp_path: Path) -> None:
    log = tmp_path / "stderr"
    with log.open("w") as err:
        up = subprocess.Popen(
            [
                *(*GRABEN, "cluster", "up", "--nodes", "2", "--root", str(tmp_path / "c")),
                *("--port", "0", "--secret-file", os.environ["GRABEN_SECRET_FILE"]),
            ],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    try:
        assert up.stdout is not None
        url = up.stdout.readline().strip()
        assert url.startswith("graben://"), log.read_text()
        victim = _node_pid(up.pid, tmp_path / "c" / "node1")
        os.kill(victim, signal.SIGKILL)
        killed = time.time()
        eventually(lambda: "started again" in log.read_text(), 20)
        said = log.read_text()
        assert "data node 1 (127.0.0.1:" in said and f"pid {victim}) killed by SIGKILL" in said
        assert "return code -9" in said, said
        assert _node_pid(up.pid, tmp_path / "c" / "node1") != victim
        with connect(url) as client:
            eventually(lambda: all(n.alive and n.last_seen > killed for n in client.health().nodes))
            client.put("/after", b"x" * 1000, replication=2)
            assert client.get("/after") == b"x" * 1000
    finally:
        stop([up])


def test_backoff_doubles_to_its_longest_and_resets_once_steady() -> None:
    backoff = Backoff(started_at=0.0)
    delays = []
    now = 1.0
    for _ in range(7):
        delays.append(backoff.died(now))
        assert not backoff.due(now) and backoff.due(now + delays[-1])
        now += delays[-1]
        backoff.started(now)
    assert delays == [FIRST_S, 2, 4, 8, 16, LONGEST_S, LONGEST_S]
    assert backoff.died(now + STEADY_S) == FIRST_S
    # restarts that fail keep doubling, however long ago it last started
    assert [backoff.died(now + STEADY_S + k) for k in range(3)] == [2, 4, 8]


def test_exit_words() -> None:
    assert exit_words(1) == "exited with code 1"
    assert exit_words(-9) == "killed by SIGKILL (return code -9)"
