"""A TLS cluster of real processes (1 metadata service, 3 data nodes) on loopback,
with a CA of the test's own: clients with the CA work through every door, the
rest are refused at once with the reason, and garbage never stops a server.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
from cluster_kit import LocalCluster
from store_kit import SMALL_CHUNK
from tls_kit import Pki, make_pki

from graben.store import TLS, Client, TLSError, connect
from graben.store.client import _loop
from graben.store.local import stop
from graben.store.transport._requests import GetLayout

MiB = 1 << 20
QUICK_S = 5.0
"""Well under the 30 s a transport failure is retried for: a refusal is told at once."""
TLS_ENV = ("GRABEN_TLS_CA", "GRABEN_TLS_CERT", "GRABEN_TLS_KEY")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(autouse=True)
def _no_tls_from_the_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in TLS_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def cluster(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """1 metadata service + 3 data nodes, TLS on every connection, RF=3."""
    flags = pki.server_flags()
    kit = LocalCluster(
        tmp_path_factory.mktemp("tls"),
        3,
        repair=0.5,
        meta_args=flags,
        node_args=flags,
        tls=TLS(ca=pki.ca),
    )
    try:
        yield kit
    finally:
        kit.close()


def _graben(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "graben.store.cli", *argv],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def _refused(client: Client) -> str:
    began = time.monotonic()
    with pytest.raises(TLSError) as caught:
        client.ls("/")
    assert time.monotonic() - began < QUICK_S
    return caught.value.message


def test_a_client_with_the_ca_writes_reads_and_lists(cluster: LocalCluster, pki: Pki) -> None:
    data = os.urandom(5 * SMALL_CHUNK + 123)
    with connect(cluster.url, tls=TLS(ca=pki.ca), chunk_size=SMALL_CHUNK) as client:
        client.put("/tls/a.bin", data)  # 6 chunks, 3 copies each: client to every node
        assert client.get("/tls/a.bin") == data
        assert [e.name for e in client.ls("/tls")] == ["a.bin"]
        client.rm("/tls", recursive=True)


def test_a_client_without_the_ca_is_refused_at_once(cluster: LocalCluster) -> None:
    with connect(cluster.url, tls=TLS()) as client:  # the system's CAs only
        message = _refused(client)
    assert "not trusted" in message and "--tls-ca" in message


def test_a_plaintext_client_is_told_the_cluster_speaks_tls(cluster: LocalCluster) -> None:
    with connect(cluster.url, tls=None) as client:
        message = _refused(client)
    assert "speaks TLS" in message and "GRABEN_TLS_CA" in message


def test_the_cli_takes_the_ca_by_flag_or_environment(
    cluster: LocalCluster, pki: Pki, tmp_path: Path
) -> None:
    local = tmp_path / "x.txt"
    local.write_text("over tls\n")
    put = _graben("put", str(local), f"{cluster.url}/cli/x.txt", "--tls-ca", str(pki.ca))
    assert put.returncode == 0, put.stderr
    env = {**os.environ, "GRABEN_TLS_CA": str(pki.ca)}
    cat = _graben("cat", f"{cluster.url}/cli/x.txt", env=env)
    assert (cat.returncode, cat.stdout) == (0, "over tls\n"), cat.stderr
    began = time.monotonic()
    refused = _graben("ls", f"{cluster.url}/cli")
    assert refused.returncode == 1
    assert "speaks TLS" in refused.stderr and "Traceback" not in refused.stderr
    assert time.monotonic() - began < 15  # a Python start, not 30 s of retries


def test_repair_between_servers_goes_over_tls(cluster: LocalCluster, pki: Pki) -> None:
    with connect(cluster.url, tls=TLS(ca=pki.ca)) as client:
        data = os.urandom(MiB)
        client.put("/repair", data)
        layout = _loop.run(client.aio.meta.request(GetLayout("/repair")))
        chunk = layout.extents[0].chunk.id
        first = layout.replicas[chunk][0]  # the copy readers try first
        ids = [(cluster.node_dir(i) / "node-id").read_text().strip() for i in range(3)]
        victim = cluster.node_dir(ids.index(first)) / "chunks" / chunk[:2] / chunk[2:4] / chunk
        victim.write_bytes(b"rot" + victim.read_bytes()[3:])
        assert client.get("/repair") == data  # a good copy, the bad one reported
        deadline = time.monotonic() + 20
        while client.fsck().problems or _held(victim)[:3] != data[:3]:
            assert time.monotonic() < deadline, "the metadata service did not repair the copy"
            time.sleep(0.2)
        assert victim.read_bytes() == data  # copied back by the service, node to node
        client.rm("/repair")


def _held(copy: Path) -> bytes:
    """A chunk file's bytes; none while it is missing (the bad copy is deleted, then
    made again: between the two it is not there)."""
    try:
        return copy.read_bytes()
    except FileNotFoundError:
        return b""


def _send(address: str, data: bytes, linger: float = 0.5) -> None:
    """Send ``data`` raw; read what comes back for ``linger`` seconds at most, then hang up."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(data)
        sock.settimeout(linger)
        try:
            while sock.recv(65536):
                pass
        except (TimeoutError, ConnectionResetError):
            pass


GARBAGE = (
    os.urandom(10_000),
    b"GET /metrics HTTP/1.1\r\n\r\n",
    b"GRB1" + os.urandom(12),
    b"\x16\x03\x01\x00\x05hello",
)


def test_garbage_and_plaintext_never_stop_a_tls_server(cluster: LocalCluster, pki: Pki) -> None:
    for address in [cluster.meta_address, *cluster.addresses]:
        for data in GARBAGE:
            _send(address, data)
        with connect(f"graben://{address}", tls=None) as plain, pytest.raises(TLSError):
            plain.ls("/")  # a plaintext graben client
    assert all(p.poll() is None for p in [cluster.meta, *cluster.nodes])
    with connect(cluster.url, tls=TLS(ca=pki.ca)) as client:
        client.put("/after-garbage", b"still serving")
        assert client.get("/after-garbage") == b"still serving"


def test_the_fsspec_door_takes_tls_from_the_environment(
    cluster: LocalCluster, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRABEN_TLS_CA", str(pki.ca))
    url = f"{cluster.url}/fsspec/hello.txt"
    with fsspec.open(url, "wb") as f:
        f.write(b"hello over tls")
    with fsspec.open(url, "rb") as f:
        assert f.read() == b"hello over tls"
    fs, _ = fsspec.core.url_to_fs(url)
    fs.rm(f"{cluster.url}/fsspec", recursive=True)


# -- mutual TLS ------------------------------------------------------------------


@pytest.fixture(scope="module")
def mtls(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Every server requires client certificates; they show theirs to each other."""
    flags = pki.server_flags(client_auth=True)
    kit = LocalCluster(
        tmp_path_factory.mktemp("mtls"),
        3,
        meta_args=flags,
        node_args=flags,
        tls=pki.client,
    )
    try:
        yield kit
    finally:
        kit.close()


def test_mutual_tls_lets_a_client_with_a_certificate_in(mtls: LocalCluster, pki: Pki) -> None:
    data = os.urandom(3 * SMALL_CHUNK)
    with connect(mtls.url, tls=pki.client, chunk_size=SMALL_CHUNK) as client:
        client.put("/m.bin", data)
        assert client.get("/m.bin") == data


def test_mutual_tls_refuses_a_client_without_a_certificate(mtls: LocalCluster, pki: Pki) -> None:
    with connect(mtls.url, tls=TLS(ca=pki.ca)) as client:
        message = _refused(client)
    assert "requires a client certificate" in message and "GRABEN_TLS_CERT" in message
    with connect(mtls.url, tls=pki.stranger) as client:
        assert "does not trust this client's certificate" in _refused(client)


def test_mutual_tls_refuses_a_stranger_at_a_data_node(mtls: LocalCluster, pki: Pki) -> None:
    with connect(f"graben://{mtls.addresses[0]}", tls=TLS(ca=pki.ca)) as client:
        assert "requires a client certificate" in _refused(client)


# -- from a config file ------------------------------------------------------------


def test_a_tls_cluster_starts_from_a_config_file_alone(pki: Pki, tmp_path: Path) -> None:
    config = tmp_path / "graben.toml"
    config.write_text(
        "[cluster]\n"
        f'root = "{tmp_path / "cluster"}"\n'
        "nodes = 3\n"
        "port = 0\n"
        f'tls-cert = "{pki.server.cert}"\n'
        f'tls-key = "{pki.server.key}"\n'
        f'tls_ca = "{pki.ca}"\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "graben.store.cli", "cluster", "up", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("graben://"), proc.stderr.read() if proc.poll() is not None else url
        with pytest.MonkeyPatch.context() as patch:  # the secret cluster up made
            patch.setenv("GRABEN_SECRET_FILE", str(tmp_path / "cluster" / "secret"))
            with connect(url, tls=TLS(ca=pki.ca)) as client:
                client.put("/from-config", b"configured")
                assert client.get("/from-config") == b"configured"
                assert len([n for n in client.health().nodes if n.alive]) == 3
            with connect(url, tls=None) as plain, pytest.raises(TLSError):
                plain.ls("/")
    finally:
        proc.send_signal(signal.SIGTERM)
        stop([proc])
        assert proc.stderr is not None
        proc.stderr.close()


# -- logs --------------------------------------------------------------------------


def test_a_flood_of_failed_handshakes_is_one_log_line(pki: Pki, tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "graben.store.cli", "meta", "serve", "--init"),
            *("--engine", f"sqlite:///{tmp_path / 'meta.db'}", "--listen", "127.0.0.1:0"),
            *pki.server_flags(),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().strip().removeprefix("listening on ")
        for _ in range(30):
            _send(address, b"GET / HTTP/1.1\r\n\r\n", 0.05)
        with connect(f"graben://{address}", tls=TLS(ca=pki.ca)) as client:
            assert client.ls("/") == []  # still serving
    finally:
        stop([proc])
    assert proc.stderr is not None
    log = proc.stderr.read()
    proc.stderr.close()
    refused = [line for line in log.splitlines() if "refused a TLS connection" in line]
    assert len(refused) == 1, log  # the rest held back, counted on the next line after 10 s
    assert "http request" in refused[0] and "WARNING graben.tls" in refused[0]


# -- flags that cannot work ------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--tls-key", "server.key"), "need --tls-cert"),
        (("--tls-ca", "ca.pem"), "need --tls-cert"),
        (("--tls-cert", "CERT", "--tls-client-auth", "required"), "needs --tls-ca"),
        (("--tls-cert", "missing.pem"), "no such TLS certificate or key file"),
        (("--tls-cert", "CERT", "--tls-key", "OTHER_KEY"), "cannot load the TLS certificate"),
    ],
)
def test_tls_flags_that_cannot_work_stop_a_server_at_start(
    pki: Pki, tmp_path: Path, flags: tuple[str, ...], says: str
) -> None:
    real = {"CERT": str(pki.server.cert), "OTHER_KEY": str(pki.client.key)}
    argv = [real.get(f, f) for f in flags]
    done = _graben("node", "serve", "--data", str(tmp_path / "d"), "--meta", "127.0.0.1:9", *argv)
    assert done.returncode == 1
    assert says in done.stderr and "Traceback" not in done.stderr


def test_a_bad_tls_file_stops_the_metadata_service_before_it_makes_a_store(
    pki: Pki, tmp_path: Path
) -> None:
    engine = tmp_path / "meta.db"
    done = _graben(
        *("meta", "serve", "--init", "--engine", f"sqlite:///{engine}", "--listen", "127.0.0.1:0"),
        *("--tls-cert", str(pki.server.cert), "--tls-key", str(pki.client.key)),
    )
    assert done.returncode == 1 and "cannot load the TLS certificate" in done.stderr
    assert not engine.exists()


def test_a_plaintext_client_sends_no_token_before_it_knows_the_server(
    tmp_path: Path,
) -> None:
    """A TLS port would read a plaintext client's first frame in the clear: the client
    says hello first, with nothing secret in it, and stops at TLS's answer."""
    received = bytearray()
    secret = "tok-" + os.urandom(8).hex()

    def tls_port(server: socket.socket) -> None:
        conn, _ = server.accept()
        with conn:
            conn.settimeout(5)
            with contextlib.suppress(OSError):
                received.extend(conn.recv(65536))
                conn.sendall(b"\x15\x03\x03\x00\x02\x02\x28")  # TLS: fatal handshake_failure

    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        answering = threading.Thread(target=tls_port, args=(server,))
        answering.start()
        try:
            with (
                connect(f"graben://127.0.0.1:{port}", token=secret, tls=None) as client,
                pytest.raises(TLSError, match="speaks TLS"),
            ):
                client.ls("/")
        finally:
            answering.join(10)
    assert received  # the hello arrived
    assert secret.encode() not in received
