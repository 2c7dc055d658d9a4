"""Several metadata services on one engine: one leads, another takes over when it dies.

Real ``graben meta serve`` processes share a SQLite file or a PostgreSQL
database (``pg_kit.py``; skipped with the reason where PostgreSQL is
missing); real data nodes heartbeat to the service that stays up. The lease
lasts 5 s (``_leader.LEASE_S``) and is renewed every second.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from cluster_kit import alive, copies, eventually
from pg_kit import Engine
from ranks_kit import free_port

from graben.store import connect
from graben.store.client import _loop
from graben.store.local import kill, spawn, stop
from graben.store.meta.engines._postgres_url import display_url
from graben.store.transport._requests import GetLayout

GRABEN = (sys.executable, "-m", "graben.store.cli")
MiB = 1 << 20
TAKEOVER_S = 10.0
"""The lease lapses 5 s after its last renewal; the others try every second."""


class Meta:
    """One ``graben meta serve`` process, logging to a file, with its metrics served."""

    def __init__(self, engine: str, log: Path) -> None:
        self.log, self.metrics_port = log, free_port()
        with log.open("w") as err:
            self.proc = subprocess.Popen(
                [
                    *(*GRABEN, "meta", "serve", "--init", "--engine", engine),
                    *("--listen", "127.0.0.1:0", "--repair-interval", "0.5"),
                    *("--heartbeat-timeout", "5", "--metrics", f"127.0.0.1:{self.metrics_port}"),
                    # Repair is the only duty that talks to the nodes here: a test that
                    # waits for the leader's connection to a node means repair's copy
                    # (a rebalance onto the new, empty node or a sweep would connect too).
                    *("--rebalance-rate", "0", "--orphan-grace", "inf"),
                ],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        assert line.startswith("listening on "), line + log.read_text()
        self.address = line.removeprefix("listening on ")
        self.url = f"graben://{self.address}"

    def status(self, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*GRABEN, "status", "--store", self.url, *extra],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )

    def health(self) -> dict[str, Any]:
        done = self.status("--json")
        assert done.stdout, done.stderr
        health: dict[str, Any] = json.loads(done.stdout)
        return health

    def me(self, health: dict[str, Any]) -> dict[str, Any]:
        """This service's entry in ``health``'s services."""
        (found,) = [s for s in health["services"] if s["address"] == self.address]
        return found

    def scrape(self) -> dict[str, float]:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as reply:
            text = reply.read().decode()
        return {
            name: float(value)
            for name, _, value in (line.rpartition(" ") for line in text.splitlines())
            if name and not name.startswith("#")
        }

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def close(self) -> None:
        self.signal(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        stop([self.proc])


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'meta.db'}"
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture
def two(engine: str, tmp_path: Path) -> Iterator[tuple[Meta, Meta]]:
    """Two services on one store; the first started leads (it found the lease free)."""
    first = Meta(engine, tmp_path / "first.log")
    try:
        second = Meta(engine, tmp_path / "second.log")
    except BaseException:
        first.close()
        raise
    try:
        yield first, second
    finally:
        second.close()
        first.close()
        for meta in (first, second):  # shown if the test failed
            print(f"--- {meta.log.name}\n{meta.log.read_text()}")


def _leads(meta: Meta, health: dict[str, Any]) -> bool:
    return bool(health["leader"]) and health["leader"] == meta.me(health)["id"]


def test_two_services_one_leads_and_status_shows_both_and_the_engine(
    two: tuple[Meta, Meta], engine: str
) -> None:
    first, second = two
    health = second.health()
    services = {s["address"]: s for s in health["services"]}
    assert set(services) == {first.address, second.address}
    assert all(s["alive"] for s in services.values())
    assert health["leader"] == services[first.address]["id"]  # exactly one: the lease's holder
    assert health["fence"] >= 1
    assert first.health()["leader"] == health["leader"]  # both say the same
    shown = display_url(engine) if engine.startswith("postgresql") else engine.replace("///", "//")
    assert health["engine"] == shown

    text = first.status()
    assert text.returncode == 1  # no data node yet: the exit code says so, as it did
    lines = text.stdout.splitlines()
    assert f"engine {shown}" in lines
    roles = {
        line.split()[1]: line
        for line in lines
        if line.startswith(tuple(s["id"] for s in services.values()))
    }
    assert roles[first.address].endswith(f"up     leader (fence {health['fence']})")
    assert roles[second.address].endswith("up     standby")
    password = urlsplit(engine).password
    assert password is None or password not in text.stdout + json.dumps(health)
    assert first.scrape()["graben_meta_leader"] == 1
    assert second.scrape()["graben_meta_leader"] == 0
    assert second.scrape()["graben_meta_fence"] == health["fence"]


def _node(root: Path, i: int, meta: Meta) -> tuple[subprocess.Popen[str], str]:
    """Data node ``i`` heartbeating to ``meta``, and its address."""
    return spawn(
        *("node", "serve", "--data", str(root / f"node{i}"), "--meta", meta.address),
        *("--rack", f"rack{i}", "--listen", "127.0.0.1:0"),
    )


def _talks_to(pid: int, port: int) -> bool:
    """Whether process ``pid`` has a connection open to loopback ``port``."""
    sockets = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                sockets.add(target[8:-1])
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[2].rpartition(":")[2], 16) == port and fields[9] in sockets:
            return True
    return False


def test_the_leader_killed_the_other_takes_over_and_repairs(
    two: tuple[Meta, Meta], tmp_path: Path
) -> None:
    leader, other = two
    fence = leader.health()["fence"]
    nodes = [_node(tmp_path, i, other)[0] for i in range(3)]  # they heartbeat to the survivor
    try:
        with connect(other.url, chunk_size=MiB) as client:
            eventually(lambda: alive(client) == 3)
            kill(nodes[1])
            data = os.urandom(4 * MiB)
            client.put("/during", data)  # replication 3, at least 2 copies: 2 now
            assert copies(client, "/during") == [2, 2, 2, 2]

            kill(leader.proc)
            took = eventually(lambda: _leads(other, other.health()), TAKEOVER_S)
            print(f"the other service took over in {took:.1f} s")
            assert other.health()["fence"] == fence + 1
            assert other.scrape()["graben_meta_leader"] == 1

            nodes[1], _ = _node(tmp_path, 1, other)
            eventually(lambda: copies(client, "/during") == [3, 3, 3, 3])
            assert client.get("/during") == data
            assert f"leads (fence {fence + 1})" in other.log.read_text()
            eventually(lambda: not leader.me(other.health())["alive"], 10.0)  # silent 5 s: gone
            assert "GONE" in other.status().stdout
    finally:
        stop(nodes)


def test_a_leader_stopped_past_its_lease_is_deposed_and_stays_so(
    two: tuple[Meta, Meta],
) -> None:
    leader, other = two
    fence = leader.health()["fence"]
    leader.signal(signal.SIGSTOP)  # a long pause: it cannot renew, nor know it failed to
    took = eventually(lambda: _leads(other, other.health()), TAKEOVER_S)
    print(f"the other service took over in {took:.1f} s")
    leader.signal(signal.SIGCONT)
    eventually(lambda: "stops leading" in leader.log.read_text(), 10.0)
    log = leader.log.read_text()
    assert re.search(
        rf"stops leading \(fence {fence}\): its lease was not renewed in time", log
    ) or re.search(
        rf"stops leading \(fence {fence}\): service \w+ holds the lease \(fence {fence + 1}\)", log
    ), log
    assert leader.scrape()["graben_meta_leader"] == 0
    time.sleep(2.0)  # several of its heartbeats: it must not take the lease back
    health = leader.health()
    assert _leads(other, health) and health["fence"] == fence + 1
    assert leader.me(health)["alive"]
    assert leader.scrape()["graben_meta_fence"] == fence + 1


def test_a_deposed_leaders_late_repair_write_is_refused_by_the_fence(
    two: tuple[Meta, Meta], engine: str, tmp_path: Path
) -> None:
    """The leader's copy to a data node hangs (the node is stopped) while the leader is
    stopped past its lease; the other takes over (and is killed, so nothing else
    writes); the old leader wakes, its copy completes, and recording it is refused."""
    leader, other = two
    fence = leader.health()["fence"]
    nodes = [_node(tmp_path, i, other)[0] for i in range(3)]
    ids = [""] * 4
    try:
        with connect(other.url, chunk_size=MiB) as client:
            eventually(lambda: alive(client) == 3)
            client.put("/f", os.urandom(MiB))  # on nodes 0, 1 and 2
            proc, node3 = _node(tmp_path, 3, other)
            nodes.append(proc)
            ids = [(tmp_path / f"node{i}" / "node-id").read_text().strip() for i in range(4)]
            eventually(lambda: alive(client) == 4)
            (chunk,) = _loop.run(client.aio.meta.request(GetLayout("/f"))).replicas
        port = int(node3.rpartition(":")[2])
        nodes[3].send_signal(signal.SIGSTOP)  # a copy sent to it waits
        kill(nodes[0])
        sql = (
            Engine("postgresql", engine)
            if engine.startswith("postgresql")
            else Engine("sqlite", engine.removeprefix("sqlite://"))
        )
        sql.sql("UPDATE nodes SET last_seen = 0 WHERE id = %s", ids[0])  # dead at once
        # The leader's next round copies to the one place left, node 3, and waits.
        eventually(lambda: _talks_to(leader.proc.pid, port), 10.0)
        leader.signal(signal.SIGSTOP)
        eventually(lambda: _leads(other, other.health()), TAKEOVER_S)
        other.signal(signal.SIGKILL)  # the new leader does nothing more; its lease stands
        leader.signal(signal.SIGCONT)
        eventually(lambda: "stops leading" in leader.log.read_text(), 10.0)
        nodes[3].send_signal(signal.SIGCONT)
        refused = rf"repair stopped: recording copies of {chunk} on \('{ids[3]}',\) refused"
        eventually(lambda: re.search(refused, leader.log.read_text()) is not None, 30.0)
        assert f"led under fence {fence}, but service" in leader.log.read_text()
        assert list((tmp_path / "node3" / "chunks").glob(f"??/??/{chunk}"))  # the copy is there
        held = [n for (n,) in sql.sql("SELECT node FROM replicas WHERE chunk = %s", chunk)]
        assert ids[3] not in held  # ... but the engine does not say so
        sql.close()
    finally:
        for proc in nodes:
            proc.send_signal(signal.SIGCONT)
        stop(nodes)
