"""A server's metrics: real sockets on loopback, ``/metrics`` read with a real HTTP GET."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

import pytest

from graben.store import InvalidArgument, NotFound
from graben.store.wire import Metrics
from graben.store.wire._frames import NIL, Call, encode
from graben.store.wire._rpc import Answer, Connection, Server


async def consume(call: Call, payload: memoryview | None) -> Answer:
    """Like a data node's write: the payload's buffer is released before the reply."""
    assert payload is not None
    size = payload.nbytes
    payload.release()
    return Answer(encode(size))


async def missing(call: Call, payload: memoryview | None) -> Answer:
    raise NotFound("no such thing", "/x")


def _get(where: str) -> str:
    with urllib.request.urlopen(f"http://{where}/metrics", timeout=5) as reply:
        return str(reply.read().decode())


def test_requests_bytes_and_errors_are_counted_and_unknown_ops_share_one_label() -> None:
    async def main() -> None:
        metrics = Metrics()
        where = metrics.serve("127.0.0.1", 0)
        server = await Server.start(
            {"consume": consume, "missing": missing},
            sinks={"consume": lambda call, n: memoryview(bytearray(n))},
            metrics=metrics,
        )
        try:
            conn = await Connection.open("127.0.0.1", server.port)
            for _ in range(3):
                await conn.call("consume", payload=memoryview(b"p" * 1000))
            with pytest.raises(NotFound):
                await conn.call("missing")
            for op in ("made-up-1", "made-up-2"):
                with pytest.raises(InvalidArgument):
                    await conn.call(op)
            await conn.close()
            text = await asyncio.to_thread(_get, where)
        finally:
            await server.close()
            metrics.close()
        lines = set(text.splitlines())
        assert 'graben_requests_total{op="consume",outcome="ok"} 3.0' in lines
        assert 'graben_request_seconds_count{op="consume"} 3.0' in lines
        received = 3 * (1000 + len(NIL))  # payloads and (empty) bodies
        assert f'graben_request_bytes_total{{op="consume"}} {received:.1f}' in lines
        assert 'graben_requests_total{op="missing",outcome="not_found"} 1.0' in lines
        assert 'graben_requests_total{op="unknown",outcome="invalid_argument"} 2.0' in lines
        assert "made-up" not in text
        with pytest.raises(urllib.error.URLError):  # stopped with the server
            _get(where)

    asyncio.run(main())


def test_a_taken_metrics_port_is_a_clear_error() -> None:
    first = Metrics()
    where = first.serve("127.0.0.1", 0)
    try:
        host, port = where.split(":")
        with pytest.raises(ConnectionError, match=f"cannot serve metrics on {where}"):
            Metrics().serve(host, int(port))
    finally:
        first.close()
