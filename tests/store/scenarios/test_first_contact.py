"""A dead endpoint fails in about a second; a cluster that is starting can be waited for."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from ranks_kit import free_port

from graben.store import Unavailable, connect
from graben.store.cli._main import main


def test_a_refused_endpoint_fails_within_two_seconds(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"graben://127.0.0.1:{free_port()}"
    start = time.monotonic()
    with connect(url) as client, pytest.raises(Unavailable, match=r"cannot reach.*--wait"):
        client.ls("/")
    assert time.monotonic() - start < 2.0  # was 30 s: the retry deadline of a lost service
    start = time.monotonic()
    assert main(["status", "--store", url]) == 1
    assert main(["ls", f"{url}/"]) == 1
    assert time.monotonic() - start < 4.0
    err = capsys.readouterr().err
    assert err.count("cannot reach the metadata service") == 2
    assert "Traceback" not in err and "retrying" not in err
    # the system's words, not asyncio's "[Errno 111] Connect call failed ('127.0.0.1', N)"
    assert err.count("connection refused") == 2 and "[Errno" not in err, err


def test_a_host_name_that_does_not_resolve_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agent", "status", "--agent", "nohost.invalid:7300"]) == 1
    err = capsys.readouterr().err.strip()
    assert "cannot resolve the host name" in err and "unknown error" not in err, err


def test_a_hung_service_is_told_as_hung_not_as_tls(capsys: pytest.CaptureFixture[str]) -> None:
    """A port that accepts and never answers (a SIGSTOPped service: the kernel still
    completes the handshake): one line saying so, no TLS advice, no errno, no long float."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        url = f"graben://127.0.0.1:{silent.getsockname()[1]}"
        start = time.monotonic()
        assert main(["ls", f"{url}/"]) == 1
        assert time.monotonic() - start < 4.0
    err = capsys.readouterr().err.strip()
    assert "did not answer within" in err and "hung" in err, err
    assert "TLS" not in err and "[Errno" not in err and err.count("\n") == 0, err
    assert not re.search(r"\d\.\d{4,}", err), err  # no 0.9945427429993288 s


@contextlib.contextmanager
def listening_later(port: int, target: tuple[str, int], after: float) -> Iterator[None]:
    """From ``after`` seconds on, ``127.0.0.1:port`` forwards to ``target`` (a service
    that is starting)."""
    stop, opened = threading.Event(), []

    def pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def serve() -> None:
        time.sleep(after)
        with socket.create_server(("127.0.0.1", port)) as server:
            server.settimeout(0.1)
            while not stop.is_set():
                try:
                    near, _ = server.accept()
                except TimeoutError:
                    continue
                far = socket.create_connection(target)
                opened.extend((near, far))
                for a, b in ((near, far), (far, near)):
                    threading.Thread(target=pump, args=(a, b), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        for sock in opened:
            sock.close()


def test_a_starting_cluster_is_waited_for_when_asked(cluster_url: str) -> None:
    where = urlsplit(cluster_url)
    assert where.hostname is not None and where.port is not None
    port = free_port()
    with (
        listening_later(port, (where.hostname, where.port), after=1.5),
        connect(f"graben://127.0.0.1:{port}", wait=20) as client,
    ):
        client.put("/waited", b"it came up")
        assert client.get("/waited") == b"it came up"
