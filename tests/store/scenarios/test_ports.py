"""Fixed default ports and ``--advertise``, with real server processes."""

from __future__ import annotations

import os
import resource
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_kit import LocalCluster

from graben.store import connect
from graben.store.local import cluster_up, spawn, stop

GRABEN = (sys.executable, "-m", "graben.store.cli")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    kit = LocalCluster(tmp_path, 1, replication=1)
    try:
        yield kit
    finally:
        kit.close()


OWN_NETWORK = os.geteuid() == 0 and shutil.which("unshare") is not None and shutil.which("ip")
needs_own_network = pytest.mark.skipif(
    not OWN_NETWORK, reason="a network namespace of its own needs root, unshare and ip"
)
DEFAULTS = Path(__file__).with_name("default_ports.py")


def _in_own_network(scenario: str, tmp_path: Path) -> None:
    """Run ``default_ports.py scenario`` in a network namespace of its own: the default
    ports are free there whatever this machine runs (a cluster on 7100, say), and
    nothing it binds reaches the machine's own."""
    result = subprocess.run(
        [
            *("unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"),
            *(sys.executable, str(DEFAULTS), scenario, str(tmp_path)),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@needs_own_network
def test_a_node_given_no_port_takes_the_first_free_one_from_7200(tmp_path: Path) -> None:
    _in_own_network("node", tmp_path)


@needs_own_network
def test_the_metadata_service_defaults_to_7100_and_says_so_when_it_is_taken(
    tmp_path: Path,
) -> None:
    _in_own_network("meta", tmp_path)


@needs_own_network
def test_servers_serve_metrics_beside_their_ports_and_stats_finds_them(tmp_path: Path) -> None:
    _in_own_network("metrics", tmp_path)


def test_a_wildcard_listen_address_needs_an_advertised_one(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            *(*GRABEN, "node", "serve", "--data", str(tmp_path / "n")),
            *("--meta", "127.0.0.1:1", "--listen", "0.0.0.0:0"),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "GRABEN_SECRET": "x" * 32},
    )
    assert result.returncode == 1
    assert "--advertise" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_node_heartbeats_its_advertised_address(cluster: LocalCluster, tmp_path: Path) -> None:
    # 127.0.0.2 is loopback too: the node binds every interface and is told to be dialled there.
    proc, address = spawn(
        *("node", "serve", "--data", str(tmp_path / "n"), "--meta", cluster.meta_address),
        *("--listen", "0.0.0.0:0", "--advertise", "127.0.0.2"),
    )
    try:
        host, port = address.rsplit(":", 1)
        assert host == "127.0.0.2" and int(port) > 0
        cluster.wait_alive(2)
        from graben.store import connect

        with connect(cluster.url) as client:
            assert address in {n.address for n in client.health().nodes if n.alive}
    finally:
        stop([proc])


def test_a_server_raises_its_open_file_limit_for_a_thousand_clients(tmp_path: Path) -> None:
    """Started under a soft limit of 256 descriptors (a common default is 1,024), a
    metadata service raises it towards its hard limit: a thousand-rank job holds a
    connection per rank."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    secret = tmp_path / "secret"
    secret.write_bytes(os.urandom(32))
    secret.chmod(0o600)
    serve = [*GRABEN, "meta", "serve", "--init", "--engine", f"sqlite:///{tmp_path}/m.db"]
    serve += ["--listen", "127.0.0.1:0", "--secret-file", str(secret)]
    low = ["sh", "-c", 'ulimit -Sn 256 && exec "$@"', "sh", *serve]
    with subprocess.Popen(low, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().startswith("listening on")
            limits = Path(f"/proc/{proc.pid}/limits").read_text()
            line = next(line for line in limits.splitlines() if "open files" in line)
            assert int(line.split()[3]) == min(65536, hard) > 1024, limits
        finally:
            proc.terminate()
            proc.wait(10)


def _held(port: int) -> socket.socket | None:
    """A socket listening on 127.0.0.1:``port``, or ``None`` if someone else has it."""
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        return None
    sock.listen()
    return sock


def _free_run(count: int) -> int:
    """The first of ``count`` consecutive free loopback ports."""
    for first in range(20000, 30000, count):
        held = [_held(first + i) for i in range(count)]
        for sock in held:
            if sock is not None:
                sock.close()
        if all(held):
            return first
    pytest.skip(f"no {count} consecutive free ports")


def test_cluster_up_puts_its_nodes_on_node_port_and_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--port N`` moved the metadata service but left the nodes on 7200 and up."""
    first = _free_run(3)
    ports = ("--port", str(first), "--node-port", str(first + 1))
    with cluster_up(tmp_path, 2, extra=ports) as url:
        assert url == f"graben://127.0.0.1:{first}"
        monkeypatch.setenv("GRABEN_SECRET_FILE", str(tmp_path / "secret"))
        with connect(url) as client:
            nodes = sorted(n.address for n in client.health().nodes)
    assert nodes == [f"127.0.0.1:{first + 1}", f"127.0.0.1:{first + 2}"]
