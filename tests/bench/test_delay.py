"""The bench's delaying TCP proxy: bytes intact, round trips delayed, ends passed on,
nothing left after the block. Real sockets on 127.0.0.1, a real proxy process."""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from graben.bench._delay import delaying_proxy

DELAY_S = 0.02
SLACK_S = 0.015
"""How late a round trip may be beyond ``DELAY_S`` (timers, a loaded machine), in the median."""
Serve = Callable[[socket.socket], None]
"""What a test's server does with each connection."""
Start = Callable[[Serve], tuple[str, int]]
"""Starts a test's server; its address."""
SERVER_THREAD = "test-server"


def _echo(conn: socket.socket) -> None:
    while data := conn.recv(1 << 16):
        conn.sendall(data)


def _say_hello(conn: socket.socket) -> None:
    conn.sendall(b"hello")


@pytest.fixture
def serve() -> Iterator[Start]:
    """Starts a server on 127.0.0.1 running ``handler`` in a thread per connection, and
    closing the connection after it; its address. Stopped after the test."""
    listeners: list[socket.socket] = []
    threads: list[threading.Thread] = []

    def start(handler: Serve) -> tuple[str, int]:
        listener = socket.create_server(("127.0.0.1", 0))
        listeners.append(listener)

        def handle(conn: socket.socket) -> None:
            with conn, contextlib.suppress(OSError):  # the proxy cut it: that is the test
                handler(conn)

        def accept() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:  # closed: the test is over
                    return
                thread = threading.Thread(target=handle, args=(conn,), name=SERVER_THREAD)
                thread.start()
                threads.append(thread)

        thread = threading.Thread(target=accept, name=SERVER_THREAD)
        thread.start()
        threads.append(thread)
        host, port = listener.getsockname()
        return host, port

    yield start
    for listener in listeners:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
    for thread in list(threads):
        thread.join(timeout=5)


def _connect(address: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(address, timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    got = bytearray()
    while data := sock.recv(1 << 20):
        got += data
    return bytes(got)


def test_bytes_pass_intact_both_ways(serve: Start) -> None:
    """A few MB through an echo server: every byte back, in order; a half-close passed
    on, so the replies still come."""
    data = os.urandom(6 << 20)
    with delaying_proxy(*serve(_echo), DELAY_S) as address, _connect(address) as sock:

        def send() -> None:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)

        with ThreadPoolExecutor(1) as sender:
            sent = sender.submit(send)
            back = _read_all(sock)
            sent.result()
    assert back == data


def test_a_round_trip_takes_the_delay_longer(serve: Start) -> None:
    with delaying_proxy(*serve(_echo), DELAY_S) as address, _connect(address) as sock:
        times = []
        for i in range(10):
            start = time.perf_counter()
            sock.sendall(bytes([i]))
            assert sock.recv(1) == bytes([i])
            times.append(time.perf_counter() - start)
    assert min(times) >= DELAY_S
    assert statistics.median(times) < DELAY_S + SLACK_S


def test_a_server_closing_closes_the_client_and_back(
    serve: Start,
) -> None:
    """The server's close reaches the client (after its bytes), and the client's close
    reaches the server."""
    closed = threading.Event()

    def wait_for_close(conn: socket.socket) -> None:
        if conn.recv(1) == b"":
            closed.set()

    with delaying_proxy(*serve(_say_hello), DELAY_S) as address, _connect(address) as sock:
        assert _read_all(sock) == b"hello"
    with delaying_proxy(*serve(wait_for_close), DELAY_S) as address:
        _connect(address).close()
        assert closed.wait(timeout=5)


def test_leaving_the_block_cuts_every_connection_and_leaves_nothing(
    serve: Start,
) -> None:
    before = set(threading.enumerate())
    with delaying_proxy(*serve(_echo), DELAY_S) as address:
        sock = _connect(address)
        sock.sendall(b"x")
        assert sock.recv(1) == b"x"
        assert len(_proxies()) == 1
    with sock, contextlib.suppress(ConnectionResetError):  # cut while it was open
        assert sock.recv(1) == b""
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(address, timeout=5).close()
    assert not _proxies()
    left = set(threading.enumerate()) - before
    assert all(thread.name == SERVER_THREAD for thread in left)


def _proxies() -> list[int]:
    """This process's children running the proxy."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes()
        except OSError:  # it exited while we looked
            continue
        parent = int(stat.rpartition(")")[2].split()[1])
        if parent == os.getpid() and b"graben.bench._delay" in argv:
            found.append(int(entry.name))
    return found
