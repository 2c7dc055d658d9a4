"""A cluster across hosts that loses parts of itself while it works: two metadata
services on one PostgreSQL and four data nodes, each server in a network namespace
of its own (``netns_kit``), clients and the database on the test's own host.

What a user of such a cluster relies on: a commit that returned is there, whole,
once, whatever dies after; nothing half written is ever visible; repair goes on
without the service that led it; a node cut off mid-write costs copies, not data,
and gets them back once its link returns.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_kit import alive, copies, eventually
from netns_kit import Hosts, needs_netns
from ranks_kit import stacks

from graben.bench._postgres import NoPostgres, PgServer
from graben.bench._postgres import start as start_postgres
from graben.store import AsyncClient, GrabenError, connect
from graben.store.local import make_secret_file

pytestmark = [needs_netns, pytest.mark.slow]
MiB = 1 << 20
NODES = (2, 3, 4, 5)
"""The hosts with a data node; hosts 0 and 1 run the metadata services."""
HEARTBEAT_TIMEOUT = 4.0
STOP_S = 30.0
"""How long a server may take to stop once asked (SIGTERM), on a loaded machine."""


def _content(i: int) -> bytes:
    """File ``i``'s bytes (2 KiB, its own): what it must read back as."""
    return hashlib.sha256(str(i).encode()).digest() * 64


class Cluster:
    """The servers on their hosts, and the URL naming both metadata services."""

    def __init__(self, hosts: Hosts, engine: str, root: Path) -> None:
        self.hosts, self.engine, self.root = hosts, engine, root
        self.metas = [f"{hosts.address(i)}:7100" for i in (0, 1)]
        self.url = "graben://" + ",".join(self.metas)
        self.meta_procs: dict[int, subprocess.Popen[str]] = {}
        self.node_procs: dict[int, subprocess.Popen[str]] = {}
        for i in (0, 1):
            self.start_meta(i, first=i == 0)
        for i in NODES:
            self.start_node(i)

    def start_meta(self, i: int, *, first: bool = False) -> None:
        self.meta_procs[i], _ = self.hosts.graben(
            i,
            *("meta", "serve", *(("--init",) if first else ()), "--engine", self.engine),
            *("--listen", self.metas[i], "--heartbeat-timeout", str(HEARTBEAT_TIMEOUT)),
            *("--repair-interval", "0.5"),
        )

    def start_node(self, i: int) -> None:
        self.node_procs[i], _ = self.hosts.graben(
            i,
            *("node", "serve", "--data", str(self.root / f"node{i}"), "--rack", f"rack{i}"),
            *("--meta", ",".join(self.metas), "--listen", f"{self.hosts.address(i)}:7200"),
        )

    def close(self) -> None:
        """Stop every server (before the database they use goes); one that does not stop
        within ``STOP_S`` of SIGTERM is killed and named, with where its threads were."""
        running = [
            p for p in [*self.meta_procs.values(), *self.node_procs.values()] if p.poll() is None
        ]
        for proc in running:
            proc.terminate()
        stuck = []
        for proc in running:
            try:
                proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                stuck.append(f"{proc.args[4:7]}:\n{stacks(proc.pid)}")
                proc.kill()
                proc.wait()
        assert not stuck, f"did not stop within {STOP_S} s of SIGTERM: {stuck}"

    def kill(self, proc: subprocess.Popen[str]) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def status(self) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-m", "graben.store.cli", "status", "--store", self.url, "--json"],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        assert done.stdout, done.stderr
        status: dict[str, Any] = json.loads(done.stdout)
        return status

    def leader(self) -> int:
        """The host whose metadata service leads."""
        status = self.status()
        address = next(s["address"] for s in status["services"] if s["id"] == status["leader"])
        return self.metas.index(address)


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    kit = Hosts(6, subnet=78)
    try:
        yield kit
    finally:
        kit.close()


@pytest.fixture
def postgres(hosts: Hosts) -> Iterator[PgServer]:
    """PostgreSQL on the test's host, reachable from the others across the bridge."""
    try:
        server = start_postgres(listen=f"127.0.0.1,{hosts.prefix}.1")
    except NoPostgres as exc:
        pytest.skip(str(exc))
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def cluster(
    hosts: Hosts, postgres: PgServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Cluster]:
    monkeypatch.setenv("GRABEN_SECRET_FILE", str(make_secret_file(tmp_path / "secret")))
    database = postgres.create_database()
    engine = postgres.url(database).replace("@127.0.0.1:", f"@{hosts.prefix}.1:")
    kit = Cluster(hosts, engine, tmp_path)
    try:
        with connect(kit.url) as client:
            eventually(lambda: alive(client) == len(NODES), 60.0)
        yield kit
    finally:
        kit.close()


async def _storm(
    url: str, count: int, clients: int, done: set[int], kill_after: int, kill: Callable[[], None]
) -> dict[int, str]:
    """``count`` small files committed by ``clients`` concurrent writers sharing 8
    client objects, calling ``kill`` once ``kill_after`` have returned; the files whose
    commit returned go in ``done``; the errors of those that failed are returned."""
    failed: dict[int, str] = {}
    queue = list(range(count))
    connections = [AsyncClient(url, timeout=120.0) for _ in range(8)]
    killed = False

    async def writer(client: AsyncClient) -> None:
        nonlocal killed
        while queue:
            i = queue.pop()
            try:
                await client.put(f"/storm/{i}", _content(i), exclusive=True)
            except GrabenError as exc:
                failed[i] = f"{type(exc).__name__}: {exc}"
                continue
            done.add(i)
            if len(done) >= kill_after and not killed:
                killed = True
                await asyncio.to_thread(kill)

    try:
        await asyncio.gather(*(writer(connections[n % 8]) for n in range(clients)))
    finally:
        for client in connections:
            await client.close()
    return failed


def test_the_leading_service_killed_under_64_writers_loses_nothing_and_repair_moves_on(
    cluster: Cluster,
) -> None:
    leader = cluster.leader()
    fence = cluster.status()["fence"]
    killed_at: list[int] = []

    def kill() -> None:
        killed_at.append(len(done))
        cluster.kill(cluster.meta_procs[leader])

    started = time.monotonic()
    done: set[int] = set()
    failed = asyncio.run(_storm(cluster.url, 5000, 64, done, 1500, kill))
    took = time.monotonic() - started
    print(f"5000 files from 64 writers in {took:.1f} s, the leader killed after {killed_at}")
    assert killed_at, "the storm ended before the kill"
    assert not failed, f"{len(failed)} commits failed, e.g. {next(iter(failed.items()))}"
    assert len(done) == 5000

    with connect(cluster.url) as client:
        names = sorted(int(e.path.rsplit("/", 1)[1]) for e in client.ls("/storm"))
        assert names == list(range(5000))  # each once: a repeated commit was applied once
        for i in range(5000):
            assert client.get(f"/storm/{i}") == _content(i), i

        # Repair goes on under the other service: a node lost now is made up for.
        survivor = 1 - leader
        took = eventually(lambda: cluster.leader() == survivor, 30.0)
        print(f"the other service leads {took:.1f} s after the storm")
        assert cluster.status()["fence"] > fence
        data = os.urandom(4 * MiB)
        client.put("/after/kill.bin", data)
        assert set(copies(client, "/after/kill.bin")) == {3}
        cluster.kill(cluster.node_procs[NODES[0]])
        eventually(lambda: alive(client) == len(NODES) - 1)
        took = eventually(lambda: set(copies(client, "/after/kill.bin")) == {3})
        assert client.get("/after/kill.bin") == data
        took += eventually(lambda: cluster.status()["degraded"] == 0)
        print(f"the lost node's copies of 5,001 files made again in {took:.1f} s")


def test_a_node_cut_off_mid_write_costs_copies_not_data_and_gets_them_back(
    cluster: Cluster,
) -> None:
    data = os.urandom(48 * MiB)
    cut = NODES[1]
    outcome: GrabenError | None = None
    started = time.monotonic()
    try:
        with connect(cluster.url, chunk_size=MiB, timeout=60.0) as writer:
            try:
                with writer.open("/cut/big.bin", "wb") as f:
                    f.write(data[: 8 * MiB])
                    cluster.hosts.cut(cut)  # mid-write: its copies of the rest never arrive
                    f.write(data[8 * MiB :])
            except GrabenError as exc:
                outcome = exc
        took = time.monotonic() - started
        print(f"the write with a node cut off mid-way ended in {took:.1f} s: {outcome or 'ok'}")
        with connect(cluster.url) as client:
            if outcome is None:
                assert client.get("/cut/big.bin") == data
            else:  # failed cleanly: nothing of it is visible
                assert not client.exists("/cut/big.bin")
    finally:
        cluster.hosts.cut(cut, down=False)
    with connect(cluster.url) as client:
        if outcome is not None:
            client.put("/cut/big.bin", data)  # the link is back: it goes through now
        eventually(lambda: alive(client) == len(NODES))
        # At least 3: a chunk whose copy sat on the cut node may be copied elsewhere by
        # repair before the link returns, and then counts 4 (extra copies are not trimmed).
        eventually(lambda: min(copies(client, "/cut/big.bin")) >= 3, 90.0)
        assert client.get("/cut/big.bin") == data
