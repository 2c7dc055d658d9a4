"""Prometheus metrics: real servers with ``--metrics``, read with a real HTTP GET."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_kit import Agents
from cluster_kit import LocalCluster, scrape, sum_of
from ranks_kit import free_port

from graben.store import connect
from graben.store.local import spawn, stop

MiB = 1 << 20


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[LocalCluster, int, list[int]]]:
    meta_port, node_ports = free_port(), [free_port(), free_port()]
    cluster = LocalCluster(
        tmp_path,
        nodes=2,
        replication=3,  # two nodes for three copies: every chunk is short
        repair=0.3,
        meta_args=("--metrics", f"127.0.0.1:{meta_port}"),
        node_args_of=lambda i: ("--metrics", f"127.0.0.1:{node_ports[i]}"),
    )
    try:
        yield cluster, meta_port, node_ports
    finally:
        cluster.close()


def test_metrics_move_under_puts_and_gets(cluster: tuple[LocalCluster, int, list[int]]) -> None:
    c, meta_port, node_ports = cluster
    before_meta = scrape(meta_port)
    before_nodes = [scrape(p) for p in node_ports]
    assert before_nodes[0]["graben_free_bytes"] > 0

    data = os.urandom(3 * MiB)  # three distinct chunks (equal ones would be stored once)
    with connect(c.url, chunk_size=MiB) as client:
        client.put("/a", data)
        assert client.get("/a") == data

    deadline = time.monotonic() + 20  # a repair round (every 0.3 s) sets the gauges
    while (meta := scrape(meta_port))["graben_chunks_short"] < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    nodes = [scrape(p) for p in node_ports]

    # Requests by op, the metadata service's by request type: counts, latencies, bytes.
    prepare = 'graben_requests_total{op="meta.Prepare",outcome="ok"}'
    assert meta[prepare] > before_meta.get(prepare, 0)
    assert meta['graben_request_seconds_count{op="meta.Prepare"}'] >= 1
    assert sum_of(meta, r'graben_request_bytes_total\{op="meta\.\w+"\}') > sum_of(
        before_meta, r'graben_request_bytes_total\{op="meta\.\w+"\}'
    )
    # Three 1 MiB chunks, each on both nodes; read back from one or the other.
    writes = sum(n["graben_chunk_writes_total"] for n in nodes)
    assert writes - sum(n["graben_chunk_writes_total"] for n in before_nodes) == 6
    assert sum(n["graben_chunk_reads_total"] for n in nodes) >= 3
    received = sum(sum_of(n, r'graben_request_bytes_total\{op="chunk\.write\w*"\}') for n in nodes)
    assert received >= 6 * MiB
    sent = sum(n.get('graben_response_bytes_total{op="chunk.read"}', 0) for n in nodes)
    assert sent >= 3 * MiB
    reads = 'graben_request_seconds_count{op="chunk.read"}'
    assert sum(n.get(reads, 0) for n in nodes) >= 3
    # Two nodes cannot hold three copies: every chunk stays short, and waits for repair.
    assert meta["graben_chunks_short"] == 3
    assert meta["graben_repair_queue"] == 3


def _free_ports(n: int) -> int:
    """The first of ``n`` consecutive free loopback ports."""
    for _ in range(100):
        base = free_port()
        with contextlib.ExitStack() as held:
            try:
                for port in range(base, base + n):
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return base
    raise AssertionError(f"no {n} consecutive free ports")


def test_cluster_up_serves_each_servers_metrics_on_ports_in_a_row(tmp_path: Path) -> None:
    base = _free_ports(3)
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "graben.store.cli", "cluster", "up", "--nodes", "2"),
            *("--root", str(tmp_path), "--port", "0", "--metrics", f"127.0.0.1:{base}"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("graben://")
        meta, *nodes = (scrape(port) for port in range(base, base + 3))
        assert any(k.startswith('graben_requests_total{op="meta.Heartbeat"') for k in meta)
        assert all(n["graben_free_bytes"] > 0 for n in nodes)
    finally:
        stop([proc])


def test_a_metrics_port_taken_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [
                *(sys.executable, "-m", "graben.store.cli", "meta", "serve", "--init"),
                *("--engine", f"sqlite:///{tmp_path / 'meta.db'}", "--listen", "127.0.0.1:0"),
                *("--metrics", f"127.0.0.1:{port}"),
            ],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert result.returncode != 0
    assert f"cannot serve metrics on 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr


def test_metrics_from_the_config_file(tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "graben.toml"
    config.write_text(
        f'[meta]\nengine = "sqlite:///{tmp_path / "meta.db"}"\ninit = true\n'
        f'listen = "127.0.0.1:0"\nmetrics = "127.0.0.1:{port}"\n'
    )
    proc, _ = spawn("meta", "serve", "--config", str(config))
    try:
        assert "graben_repair_queue" in scrape(port)
    finally:
        stop([proc])


def test_stats_shows_the_rates_of_each_server(
    cluster: tuple[LocalCluster, int, list[int]],
) -> None:
    c, meta_port, node_ports = cluster
    servers = [f"127.0.0.1:{p}" for p in (meta_port, *node_ports)]
    stats = subprocess.Popen(
        [sys.executable, "-m", "graben.store.cli", "stats", *servers, "--once", "--interval", "2"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    with connect(c.url, chunk_size=MiB) as client:
        deadline = time.monotonic() + 30
        while stats.poll() is None and time.monotonic() < deadline:  # load all along
            client.put("/f", os.urandom(MiB))
    out, _ = stats.communicate(timeout=30)
    assert stats.returncode == 0
    # A table per server, titled with the address given; its gauges under it.
    tables = _tables(out)
    assert list(tables) == servers
    assert any("meta.Prepare" in line for line in tables[servers[0]])
    assert any("chunks_short" in line and "repair_queue" in line for line in tables[servers[0]])
    for node in servers[1:]:
        assert any("chunk.write" in line for line in tables[node])
        assert any("free_bytes" in line for line in tables[node])


def _tables(out: str) -> dict[str, list[str]]:
    """``graben stats``' lines under each server's title."""
    tables: dict[str, list[str]] = {}
    for line in out.splitlines():
        title = line.strip() and line[0] not in "┏┃┡│└"
        if title and not line.startswith(("chunks_short", "free_bytes", "spool")):
            tables[line.strip()] = []
            continue
        list(tables.values())[-1].append(line)
    return tables


def test_stats_finds_a_clusters_servers_and_fits_the_terminal(tmp_path: Path) -> None:
    """Given no servers, ``graben stats`` reads those of the cluster at ``$GRABEN_URL``:
    every server serves metrics unless told not to, and records where."""
    c = LocalCluster(tmp_path, nodes=2, replication=2, metrics=("127.0.0.1", 0))
    try:
        with connect(c.url) as client:
            health = client.health()
        metrics = [s.metrics for s in health.services] + [n.metrics for n in health.nodes]
        assert all(m.startswith("127.0.0.1:") for m in metrics), metrics
        stats = subprocess.Popen(
            [sys.executable, "-m", "graben.store.cli", "stats", "--once", "--interval", "2"],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "GRABEN_URL": c.url, "COLUMNS": "80"},
        )
        with connect(c.url, chunk_size=MiB) as client:
            deadline = time.monotonic() + 30
            while stats.poll() is None and time.monotonic() < deadline:
                client.put("/f", os.urandom(MiB))
        out, _ = stats.communicate(timeout=30)
        assert stats.returncode == 0
        names = [f"meta {c.meta_address}", *(f"node {a}" for a in c.addresses)]
        tables = _tables(out)
        assert sorted(tables) == sorted(names), out
        assert all(any("chunk.write" in line for line in tables[f"node {a}"]) for a in c.addresses)
        assert max(map(len, out.splitlines())) <= 80, out
    finally:
        c.close()


def test_metrics_off_serves_none(tmp_path: Path) -> None:
    c = LocalCluster(tmp_path, nodes=1, replication=1, metrics="off")
    try:
        with connect(c.url) as client:
            health = client.health()
        assert [s.metrics for s in health.services] == [""]
        assert [n.metrics for n in health.nodes] == [""]
        result = subprocess.run(
            [sys.executable, "-m", "graben.store.cli", "stats", "--once"],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
            env={**os.environ, "GRABEN_URL": c.url},
        )
        assert result.returncode != 0
        assert "no server of the cluster serves metrics" in result.stderr
    finally:
        c.close()


def test_stats_of_a_server_without_metrics_says_so() -> None:
    port = free_port()
    result = subprocess.run(
        [sys.executable, "-m", "graben.store.cli", "stats", f"127.0.0.1:{port}", "--once"],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode != 0
    assert f"cannot read metrics from http://127.0.0.1:{port}/metrics" in result.stderr
    assert "Traceback" not in result.stderr


DASHBOARD = Path(__file__).resolve().parents[3] / "docs" / "grafana.json"


def _exported(at: str) -> set[str]:
    """The sample names ``http://at/metrics`` exports or will: a counter's ``_total``,
    a histogram's ``_bucket``, ``_sum`` and ``_count`` (a family with labels shows no
    sample until it has one); not the ``_created`` time prometheus_client adds to each."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{at}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    return {
        family.name + suffix
        for family in text_string_to_metric_families(text)
        if family.name.startswith("graben_") and not family.name.endswith("_created")
        for suffix in suffixes.get(family.type, ("",))
    }


def test_the_grafana_dashboard_charts_what_the_servers_export(tmp_path: Path) -> None:
    """Every metric docs/grafana.json queries is one a metadata service, a data node or
    a memory agent exports, and every one they export is charted."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]
    queried = {name for e in exprs for name in re.findall(r"\bgraben_\w+", e)}
    assert all(e.count("(") == e.count(")") and e.count("{") == e.count("}") for e in exprs)
    uses = {p["datasource"]["uid"] for p in dashboard["panels"] if p["type"] != "row"}
    assert uses == {"${datasource}"}  # the Prometheus the importer picks
    c = LocalCluster(tmp_path, nodes=1, replication=1, metrics=("127.0.0.1", 0))
    agents = Agents()
    try:
        agent_metrics = f"127.0.0.1:{free_port()}"
        agents.start("a", extra=("--metrics", agent_metrics))
        with connect(c.url) as client:
            health = client.health()
        servers = [health.services[0].metrics, health.nodes[0].metrics, agent_metrics]
        exported = set().union(*map(_exported, servers))
    finally:
        agents.close()
        c.close()
    assert queried - exported == set(), "charted, but no server exports it"
    histograms = {n for n in exported if n.endswith("_bucket")}
    charted = queried | {n.replace("_bucket", s) for n in histograms for s in ("_sum", "_count")}
    assert exported - charted == set(), "exported, but not charted"
