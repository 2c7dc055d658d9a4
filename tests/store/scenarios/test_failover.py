"""Several metadata services behind one client: real processes on one engine.

Two ``graben meta serve`` processes share one engine (a SQLite file, which
serialises their writers, or a PostgreSQL database), three data nodes
heartbeat to whichever answers, and a client names both services in its URL
(``graben://127.0.0.1:P1,127.0.0.1:P2/``). A service killed, hung or cut off
mid-stream costs the client latency, not errors; a mutation whose reply was
lost (a proxy in the test drops it) is applied once when it is repeated
through the other service, because it carries an idempotency key.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import fsspec
import msgspec
import pytest
from cluster_kit import LocalCluster
from store_kit import SMALL_CHUNK

from graben.store import Client, InvalidArgument, connect, local, split_url
from graben.store._config import resolve
from graben.store.cli._main import build_parser
from graben.store.fsspec._urls import url_of

FAILOVER_BOUND_S = 3.0
"""Longest a call may take across the death of the service it was using (the client
moves at once; this leaves room for a loaded 2-core machine)."""
GRABEN = (sys.executable, "-m", "graben.store.cli")


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest) -> str | None:
    """The cluster's ``--engine``: ``None`` for SQLite in the cluster's directory."""
    if request.param == "sqlite":
        return None
    url: str = request.getfixturevalue("pg_url")  # skips with the reason without PostgreSQL
    return url


@pytest.fixture
def cluster(tmp_path: Path, engine: str | None) -> Iterator[LocalCluster]:
    found = LocalCluster(tmp_path / "c", nodes=3, metas=2, engine=engine)
    try:
        yield found
    finally:
        found.close()


def _moves(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "graben.client" and "stopped answering" in r.getMessage()
    ]


def _client(url: str) -> Client:
    return connect(url, chunk_size=SMALL_CHUNK, timeout=30.0)


# -- a service killed mid-stream ------------------------------------------------------------


def test_writes_go_on_through_the_other_service_when_one_is_killed(
    cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "graben.client")
    stored: dict[str, bytes] = {}
    slowest: list[float] = []
    killed = threading.Event()
    after_kill = threading.Event()
    stop = threading.Event()

    def writer(client: Client, worker: int) -> None:
        i = 0
        while not stop.is_set():
            path, blob = f"/w{worker}/f{i}", os.urandom(SMALL_CHUNK + 997 * i)
            began = time.monotonic()
            client.put(path, blob)  # any error fails the test
            slowest.append(time.monotonic() - began)
            stored[path] = blob
            if killed.is_set():
                after_kill.set()
            i += 1

    with _client(cluster.url) as client, ThreadPoolExecutor(4) as pool:
        running = [pool.submit(writer, client, w) for w in range(4)]
        time.sleep(1.5)
        assert client.aio.meta.address == cluster.meta_addresses[0]
        cluster.kill_meta(0)  # SIGKILL, with writes in flight
        killed.set()
        assert after_kill.wait(30), "no write returned after the kill"
        time.sleep(1.5)
        stop.set()
        for future in running:
            future.result()
        assert client.aio.meta.address == cluster.meta_addresses[1]
    assert max(slowest) < FAILOVER_BOUND_S, sorted(slowest)[-5:]
    moves = _moves(caplog)
    assert len(moves) == 1, moves
    assert cluster.meta_addresses[0] in moves[0] and cluster.meta_addresses[1] in moves[0]
    with _client(cluster.url) as client:
        for path, blob in stored.items():
            assert client.get(path) == blob
        assert sum(len(client.ls(f"/w{w}")) for w in range(4)) == len(stored)
        assert client.fsck().ok


# -- a reply dropped: the repeat is applied once ----------------------------------------------


class DroppingProxy:
    """A TCP proxy (asyncio, on 127.0.0.1) in front of one metadata service.

    It forwards every byte both ways, except that once armed with a request
    type it drops the reply to the first request of that type: the request
    reaches the service, which applies it and answers, and the proxy closes
    the client's connection instead of forwarding the answer.
    """

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self._target = (host, int(port))
        self._marker: bytes | None = None
        self.dropped = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server = self._run(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _shutdown(self) -> None:
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def _run(self, work: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(timeout=30)

    def arm(self, request_type: str) -> None:
        """Drop the reply to the next request of this type (``"Commit"``, ``"Rename"``)."""
        self._marker = msgspec.msgpack.encode(request_type)  # the tag, as msgpack
        self.dropped = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        up_writer: asyncio.StreamWriter | None = None
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
            seen = asyncio.Event()
            await asyncio.gather(
                self._up(reader, up_writer, seen),
                self._down(up_reader, writer, up_writer, seen),
                return_exceptions=True,
            )
        finally:
            for end in (writer, up_writer):
                if end is not None:
                    end.transport.abort()
            self._tasks.discard(task)

    async def _up(
        self, reader: asyncio.StreamReader, up: asyncio.StreamWriter, seen: asyncio.Event
    ) -> None:
        tail = b""
        while data := await reader.read(1 << 16):
            window, tail = tail + data, (tail + data)[-64:]
            if self._marker is not None and not self.dropped and self._marker in window:
                seen.set()  # before the request goes on: its reply cannot overtake this
            up.write(data)
            await up.drain()

    async def _down(
        self,
        up: asyncio.StreamReader,
        client: asyncio.StreamWriter,
        up_writer: asyncio.StreamWriter,
        seen: asyncio.Event,
    ) -> None:
        while data := await up.read(1 << 16):
            if seen.is_set() and not self.dropped:
                self.dropped += 1
                client.transport.abort()
                up_writer.transport.abort()
                return
            client.write(data)
            await client.drain()

    def close(self) -> None:
        self._run(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


@pytest.fixture
def proxy(cluster: LocalCluster) -> Iterator[DroppingProxy]:
    found = DroppingProxy(cluster.meta_addresses[0])
    try:
        yield found
    finally:
        found.close()


def test_a_mutation_whose_reply_was_dropped_is_applied_once(
    cluster: LocalCluster, proxy: DroppingProxy
) -> None:
    url = f"graben://{proxy.address},{cluster.meta_addresses[1]}"
    data = os.urandom(3 * SMALL_CHUNK + 5)

    def through_the_proxy(request_type: str) -> Client:
        proxy.arm(request_type)
        return _client(url)  # a fresh client starts at the first endpoint: the proxy

    with through_the_proxy("Commit") as client:
        with client.open("/x", "xb") as f:  # create-exclusive: a second apply would fail
            f.write(data)
        assert proxy.dropped == 1
        assert client.aio.meta.address == cluster.meta_addresses[1]
        info = client.stat("/x")
        assert info.generation == 1 and client.get("/x") == data
    with through_the_proxy("Rename") as client:
        assert client.rename("/x", "/y").path == "/y"  # not NotFound
        assert proxy.dropped == 1
        assert not client.exists("/x") and client.get("/y") == data
        assert client.stat("/y").inode == info.inode
    with through_the_proxy("Remove") as client:
        client.rm("/y")  # not NotFound
        assert proxy.dropped == 1
        assert not client.exists("/y")
    with through_the_proxy("MakeDir") as client:
        client.mkdir("/d")  # not AlreadyExists
        assert proxy.dropped == 1
        assert client.stat("/d").is_dir
    with _client(url) as client:
        assert client.fsck().ok


# -- a service that hangs: it still accepts connections, but answers nothing ------------------


def test_a_hung_service_is_left_for_the_other_within_seconds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "graben.client")
    # The nodes heartbeat to the second service, and the first repairs nothing: stopped
    # while idle, it holds no engine lock the second would wait for.
    cluster = LocalCluster(tmp_path / "c", nodes=3, metas=2, repair=3600.0, nodes_meta_first=1)
    stopped = False
    try:
        with _client(cluster.url) as client:
            client.put("/before", b"before")
            assert client.aio.meta.address == cluster.meta_addresses[0]
            cluster.metas[0].send_signal(signal.SIGSTOP)
            stopped = True
            began = time.monotonic()
            client.put("/after", b"after")
            took = time.monotonic() - began
            assert client.aio.meta.address == cluster.meta_addresses[1]
            assert client.get("/before") == b"before" and client.get("/after") == b"after"
        assert took < 8.0, took  # a ping unanswered for 2 s after a 1 s wait, and the move
        moves = _moves(caplog)
        assert len(moves) == 1 and "did not answer a ping" in moves[0], moves
    finally:
        if stopped:
            cluster.metas[0].send_signal(signal.SIGCONT)
        cluster.close()


# -- a DNS name with several addresses --------------------------------------------------------


def test_a_name_with_several_addresses_is_several_services(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``graben://NAME:PORT/`` where NAME has two A records, one service behind each.

    DNS cannot be edited here (nor /etc/hosts, which is the machine's): the test
    replaces only the system resolver call (``socket.getaddrinfo``, which
    ``loop.getaddrinfo`` runs) so that one made-up name answers 127.0.0.2 and
    127.0.0.3; every other name resolves as usual. The services listen on those
    two loopback addresses, on one port, as two hosts would.
    """
    caplog.set_level(logging.INFO, "graben.client")
    name = "graben-meta.test"
    real = socket.getaddrinfo

    def resolver(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != name:
            return real(host, port, *args, **kwargs)
        return [
            (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (f"127.0.0.{i}", port))
            for i in (2, 3)
        ]

    engine = f"sqlite:///{tmp_path / 'meta.db'}"
    serve = ("meta", "serve", "--init", "--engine", engine, "--replication", "3")
    procs: list[subprocess.Popen[str]] = []
    try:
        first, address = local.spawn(*serve, "--listen", "127.0.0.2:0")
        procs.append(first)
        port = int(address.rpartition(":")[2])
        second, _ = local.spawn(*serve, "--listen", f"127.0.0.3:{port}")
        procs.append(second)
        metas = f"127.0.0.2:{port},127.0.0.3:{port}"
        for i in range(3):
            node, _ = local.spawn(
                *("node", "serve", "--data", str(tmp_path / f"n{i}"), "--meta", metas),
                *("--rack", f"r{i}", "--listen", "127.0.0.1:0"),
            )
            procs.append(node)
        monkeypatch.setattr(socket, "getaddrinfo", resolver)
        with _client(f"graben://{name}:{port}/") as client:
            _wait_for(lambda: sum(n.alive for n in client.health().nodes) == 3)
            client.put("/a", b"through the first address")
            assert client.aio.meta.address == f"127.0.0.2:{port}"
            first.send_signal(signal.SIGKILL)
            first.wait()
            client.put("/b", b"through the second")
            assert client.aio.meta.address == f"127.0.0.3:{port}"
            assert client.get("/a") == b"through the first address"
        moves = _moves(caplog)
        assert len(moves) == 1 and f"127.0.0.2:{port}" in moves[0]
        assert f"moving to 127.0.0.3:{port}" in moves[0]
    finally:
        local.stop(procs)


def _wait_for(check: Any, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.2)


# -- every door takes the list of endpoints ------------------------------------------------------


def test_fsspec_and_the_command_line_keep_the_whole_list_of_endpoints(
    tmp_path: Path,
) -> None:
    cluster = LocalCluster(tmp_path / "c", nodes=3, metas=2)
    try:
        base = cluster.url
        assert base.count(",") == 1
        with fsspec.open(f"{base}/dir/a", "wb") as f:
            f.write(b"alpha")
        fs, path = fsspec.core.url_to_fs(f"{base}/dir")
        endpoints = base.removeprefix("graben://")
        assert path == f"{endpoints}/dir"  # fsspec's form keeps every endpoint, as S3 a bucket
        names = fs.ls(f"{base}/dir", detail=False)
        assert [fs.unstrip_protocol(n) for n in names] == [f"{base}/dir/a"]
        assert fs.unstrip_protocol(f"{endpoints}/dir/a") == f"{base}/dir/a"
        assert fs._strip_protocol(f"{base}/dir/a") == f"{endpoints}/dir/a"
        assert fs.cat_file(f"{base}/dir/a") == b"alpha"
        assert fs.cat_file(names[0]) == b"alpha"  # a name it gave back reopens there
        cluster.kill_meta(0)
        assert fs.cat_file(f"{base}/dir/a") == b"alpha"  # through the second
        listed = subprocess.run(
            [*GRABEN, "ls", f"{base}/dir"], capture_output=True, text=True, timeout=60, check=False
        )
        assert listed.returncode == 0, listed.stderr
        assert "a" in listed.stdout.split()
        shown = subprocess.run(
            [*GRABEN, "cat", f"{base}/dir/a"], capture_output=True, timeout=60, check=False
        )
        assert shown.returncode == 0 and shown.stdout == b"alpha"
    finally:
        cluster.close()


def test_a_url_names_every_metadata_service_in_order() -> None:
    target = resolve("graben://meta-a:7100,10.0.0.2:7101,[::1]:7102/ckpt/step-1")
    assert target.addresses == (("meta-a", 7100), ("10.0.0.2", 7101), ("::1", 7102))
    assert url_of(target) == "graben://meta-a:7100,10.0.0.2:7101,[::1]:7102"
    assert resolve(url_of(target)) == target
    assert split_url("graben://a:1,b:2/x/y") == ("graben://a:1,b:2", "/x/y")
    assert resolve("graben://a:1,b:2") != resolve("graben://b:2,a:1")  # the order is a preference


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("graben://a:7100,b/x", "host:port for each metadata service"),
        ("graben://a:7100,,b:7100/x", "host:port for each metadata service"),
        ("graben://a:7100,b:http/x", "not a store URL"),
    ],
)
def test_a_bad_endpoint_in_a_url_is_refused_naming_it(url: str, says: str) -> None:
    with pytest.raises(InvalidArgument, match=says) as caught:
        connect(url)
    assert url in str(caught.value)


def test_a_node_takes_several_metadata_services() -> None:
    parser = build_parser()
    args = parser.parse_args(["node", "serve", "--data", "/d", "--meta", "h1:7100,h2:7101"])
    assert args.meta == (("h1", 7100), ("h2", 7101))
    done = subprocess.run(
        [*GRABEN, "node", "serve", "--data", "/nonexistent", "--meta", "h1:7100,h2"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "'h2' is not HOST:PORT" in done.stderr
