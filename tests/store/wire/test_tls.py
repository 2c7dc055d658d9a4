"""TLS on the wire: a CA of the test's own (trustme), real sockets on loopback.

A client with the CA talks to a TLS server; every way TLS can go wrong (an
untrusted server, a name the certificate does not hold, a client certificate
missing or from another CA, TLS on one side only) is a ``TLSError`` that says
so at once, and nothing a peer sends stops the server serving.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from tls_kit import Pki, make_pki

from graben.store import TLS, InvalidArgument, NotFound, Options, TLSError
from graben.store.wire import tls
from graben.store.wire._frames import MAGIC, PREFIX, Call, decode, encode
from graben.store.wire._rpc import Answer, Connection, Server

QUICK_S = 3.0
"""Well under the 30 s a transport failure is retried for: a refusal is told at once."""


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


async def echo(call: Call, payload: memoryview | None) -> Answer:
    return Answer(call.body, payload)


def serving(server_tls: TLS | None, test: Callable[[Server], Awaitable[None]]) -> None:
    """Run ``test`` against an echo server (over TLS with ``server_tls``)."""

    async def main() -> None:
        context = None if server_tls is None else tls.server_context(server_tls)
        server = await Server.start(
            {"echo": echo}, sinks={"echo": lambda c, n: memoryview(bytearray(n))}, tls=context
        )
        try:
            await test(server)
        finally:
            await server.close()

    asyncio.run(main())


async def _echo(server: Server, client: TLS | None, data: bytes = b"hi") -> bytes:
    context = None if client is None else tls.client_context(client)
    conn = await Connection.open("127.0.0.1", server.port, tls=context)
    try:
        into = bytearray(len(data))
        _, n = await conn.call("echo", encode(1), payload=memoryview(data), into=memoryview(into))
        return bytes(into[:n])
    finally:
        await conn.close()


async def _refused(server: Server, client: TLS | None) -> str:
    """The ``TLSError`` a client gets, checked to come quickly."""
    began = time.monotonic()
    with pytest.raises(TLSError) as caught:
        await _echo(server, client)
    assert time.monotonic() - began < QUICK_S
    return caught.value.message


def test_a_client_with_the_ca_moves_large_payloads_over_tls(pki: Pki) -> None:
    async def test(server: Server) -> None:
        data = os.urandom(24 << 20)
        assert await _echo(server, TLS(ca=pki.ca), data) == data
        assert len(server.sessions) <= 1  # its own, until the server sees it go

    serving(pki.server, test)


def test_many_calls_share_one_tls_connection(pki: Pki) -> None:
    async def test(server: Server) -> None:
        conn = await Connection.open("127.0.0.1", server.port, tls=tls.client_context(pki.client))
        try:
            replies = await asyncio.gather(*(conn.call("echo", encode(i)) for i in range(200)))
            assert [decode(body, int) for body, _ in replies] == list(range(200))
        finally:
            await conn.close()

    serving(pki.server, test)


def test_concurrent_large_payloads_on_one_tls_connection_stay_whole(pki: Pki) -> None:
    async def test(server: Server) -> None:
        conn = await Connection.open("127.0.0.1", server.port, tls=tls.client_context(pki.client))
        blobs = [os.urandom((1 << 20) + 4099 * i) for i in range(8)]
        intos = [bytearray(len(b)) for b in blobs]

        async def one(i: int) -> int:
            _, n = await conn.call(
                "echo", encode(i), payload=memoryview(blobs[i]), into=memoryview(intos[i])
            )
            return n

        try:
            assert await asyncio.gather(*(one(i) for i in range(8))) == [len(b) for b in blobs]
            assert intos == blobs
        finally:
            await conn.close()

    serving(pki.server, test)


def test_a_call_cancelled_mid_payload_drops_its_tls_connection(pki: Pki) -> None:
    """Over TLS a payload goes out in slices: one cut short must not leave the stream
    for the next frame to be read as its rest."""

    async def test(server: Server) -> None:
        conn = await Connection.open("127.0.0.1", server.port, tls=tls.client_context(pki.client))
        data = memoryview(bytearray(256 << 20))
        sending = asyncio.ensure_future(conn.call("echo", encode(0), payload=data))
        while conn._protocol._writable.is_set():  # until the socket is full, mid-payload
            await asyncio.sleep(0)
        sending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sending
        assert conn.closed
        await conn.close()
        assert await _echo(server, pki.client, b"next") == b"next"

    serving(pki.server, test)


def test_a_client_without_the_ca_is_told_the_server_is_not_trusted(pki: Pki) -> None:
    async def test(server: Server) -> None:
        message = await _refused(server, TLS())  # the system's CAs only
        assert "not trusted" in message and "--tls-ca" in message
        assert f"127.0.0.1:{server.port}" in message

    serving(pki.server, test)


def test_a_certificate_for_another_host_is_not_trusted(pki: Pki) -> None:
    async def test(server: Server) -> None:
        message = await _refused(server, TLS(ca=pki.ca))
        assert "not trusted" in message and "127.0.0.1" in message

    serving(pki.elsewhere, test)


def test_mutual_tls_refuses_a_client_without_a_certificate(pki: Pki) -> None:
    required = TLS(ca=pki.ca, cert=pki.server.cert, key=pki.server.key, client_auth=True)

    async def test(server: Server) -> None:
        message = await _refused(server, TLS(ca=pki.ca))
        assert "requires a client certificate" in message and "--tls-cert" in message
        assert await _echo(server, pki.client) == b"hi"  # one signed by the CA gets in

    serving(required, test)


def test_mutual_tls_refuses_a_certificate_of_another_ca(pki: Pki) -> None:
    required = TLS(ca=pki.ca, cert=pki.server.cert, key=pki.server.key, client_auth=True)

    async def test(server: Server) -> None:
        message = await _refused(server, pki.stranger)
        assert "does not trust this client's certificate" in message

    serving(required, test)


def test_a_plaintext_client_of_a_tls_server_is_told_to_use_tls(pki: Pki) -> None:
    async def test(server: Server) -> None:
        message = await _refused(server, None)
        assert "speaks TLS" in message and "--tls-ca" in message

    serving(pki.server, test)


def test_a_tls_client_of_a_plaintext_server_is_told_it_does_not_speak_tls(pki: Pki) -> None:
    async def test(server: Server) -> None:
        message = await _refused(server, TLS(ca=pki.ca))
        assert "does not speak TLS" in message
        assert await _echo(server, None) == b"hi"  # and it still serves plaintext

    serving(None, test)


def _send(port: int, data: bytes, linger: float = 1.0) -> None:
    """Send ``data`` raw, read what comes back until the server closes or ``linger`` ends."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        sock.settimeout(linger)
        try:
            while sock.recv(65536):
                pass
        except (TimeoutError, ConnectionResetError):
            pass


GARBAGE = [
    os.urandom(10_000),
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    MAGIC + PREFIX.pack(MAGIC, 10, 0)[4:] + b"0123456789",  # a plaintext graben frame
    b"\x16\x03\x01\x02\x00" + os.urandom(512),  # a TLS record header, then noise
    b"\x16\x03",  # half a hello, then silence
    b"",  # connect and hang up
]


def test_garbage_and_plaintext_leave_a_tls_server_serving(pki: Pki) -> None:
    async def test(server: Server) -> None:
        loop = asyncio.get_running_loop()
        for data in GARBAGE:
            await loop.run_in_executor(None, _send, server.port, data, 0.5)
        assert await _echo(server, TLS(ca=pki.ca), b"after") == b"after"
        await asyncio.sleep(0.2)
        assert not server.sessions  # nothing of the failed handshakes is kept

    serving(pki.server, test)


def test_a_failed_handshake_is_logged(pki: Pki, caplog: pytest.LogCaptureFixture) -> None:
    async def test(server: Server) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, _send, server.port, b"GET / HTTP/1.1\r\n\r\n", 0.5)

    with caplog.at_level(logging.WARNING, "graben.tls"):
        serving(pki.server, test)
    assert any("refused a TLS connection" in r.getMessage() for r in caplog.records)


def test_a_plaintext_server_logs_a_tls_client(pki: Pki, caplog: pytest.LogCaptureFixture) -> None:
    async def test(server: Server) -> None:
        await _refused(server, TLS(ca=pki.ca))
        await asyncio.sleep(0.1)

    with caplog.at_level(logging.WARNING, "graben.wire"):
        serving(None, test)
    assert any("TLS client dialled this plaintext" in r.getMessage() for r in caplog.records)


# -- settings -----------------------------------------------------------------


def test_tls_settings_come_from_the_environment(pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GRABEN_TLS_CA", "GRABEN_TLS_CERT", "GRABEN_TLS_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert Options().tls is None  # plaintext unless asked
    monkeypatch.setenv("GRABEN_TLS_CA", str(pki.ca))
    assert Options().tls == TLS(ca=str(pki.ca))
    monkeypatch.setenv("GRABEN_TLS_CERT", str(pki.client.cert))
    monkeypatch.setenv("GRABEN_TLS_KEY", str(pki.client.key))
    assert Options().tls == TLS(ca=str(pki.ca), cert=str(pki.client.cert), key=str(pki.client.key))
    assert Options(tls=None).tls is None  # an argument beats the environment


def test_bad_tls_files_are_clear_errors(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="CA file"):
        tls.client_context(TLS(ca=tmp_path / "missing.pem"))
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    with pytest.raises(InvalidArgument, match=r"junk\.pem"):
        tls.client_context(TLS(ca=tmp_path / "junk.pem"))
    with pytest.raises(InvalidArgument, match="certificate and key"):
        tls.server_context(TLS(cert=pki.server.cert, key=pki.client.key))  # not its key
    with pytest.raises(NotFound):
        tls.server_context(TLS(cert=tmp_path / "none.pem", key=pki.server.key))
    with pytest.raises(InvalidArgument, match="needs its certificate"):
        TLS(key=pki.server.key)
    with pytest.raises(InvalidArgument, match="CA"):
        TLS(cert=pki.server.cert, client_auth=True)


def test_a_client_may_bring_its_own_ssl_context(pki: Pki) -> None:
    context = ssl.create_default_context(cafile=str(pki.ca))
    assert tls.client_context(context) is context

    async def test(server: Server) -> None:
        conn = await Connection.open("127.0.0.1", server.port, tls=context)
        await conn.close()

    serving(pki.server, test)
