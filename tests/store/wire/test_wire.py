"""The wire and RPC layer: real sockets on loopback, and the frame parser alone."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import hypothesis.strategies as st
import msgspec
import pytest
from hypothesis import given, settings

from graben.store import GrabenError, InvalidArgument, NotFound, Timeout, Unavailable
from graben.store.wire._frames import (
    MAGIC,
    NIL,
    PREFIX,
    Call,
    FileSpan,
    FrameProtocol,
    Header,
    Reply,
    decode,
    encode,
    frame_prefix,
    to_wire,
)
from graben.store.wire._rpc import Answer, Connection, Server


async def echo(call: Call, payload: memoryview | None) -> Answer:
    return Answer(call.body, payload)


async def fail_not_found(call: Call, payload: memoryview | None) -> Answer:
    raise NotFound("no such thing", "/x")


async def crash(call: Call, payload: memoryview | None) -> Answer:
    raise RuntimeError("bug")


async def slow(call: Call, payload: memoryview | None) -> Answer:
    await asyncio.sleep(decode(call.body, float))
    return Answer(encode("late"), memoryview(b"p" * 1000))


HANDLERS = {"echo": echo, "missing": fail_not_found, "crash": crash, "slow": slow}
SINKS = {"echo": lambda call, n: memoryview(bytearray(n))}
"""Only ``echo`` takes a payload."""


def with_server(test: Callable[[Server], Awaitable[None]]) -> None:
    async def main() -> None:
        server = await Server.start(HANDLERS, sinks=SINKS)
        try:
            await test(server)
        finally:
            await server.close()

    asyncio.run(main())


def test_round_trip_with_a_large_payload_landing_in_place() -> None:
    async def test(server: Server) -> None:
        conn = await Connection.open("127.0.0.1", server.port)
        data = os.urandom(64 << 20)
        into = bytearray(len(data))
        body, n = await conn.call(
            "echo", encode({"k": 1}), payload=memoryview(data), into=memoryview(into)
        )
        assert decode(body, dict) == {"k": 1}
        assert n == len(data) and into == data
        await conn.close()

    with_server(test)


def test_many_concurrent_calls_on_one_connection_are_matched() -> None:
    async def test(server: Server) -> None:
        conn = await Connection.open("127.0.0.1", server.port)
        replies = await asyncio.gather(*(conn.call("echo", encode(i)) for i in range(2000)))
        assert [decode(body, int) for body, _ in replies] == list(range(2000))
        await conn.close()

    with_server(test)


def test_errors_cross_as_their_own_class_and_the_server_lives_on() -> None:
    async def test(server: Server) -> None:
        conn = await Connection.open("127.0.0.1", server.port)
        with pytest.raises(NotFound) as info:
            await conn.call("missing")
        assert info.value.path == "/x" and isinstance(info.value, FileNotFoundError)
        with pytest.raises(InvalidArgument, match="unknown operation 'nope'"):
            await conn.call("nope")
        with pytest.raises(GrabenError, match="internal error"):
            await conn.call("crash")
        assert (await conn.call("echo", encode("still here")))[0] == encode("still here")
        await conn.close()

    with_server(test)


def test_timeout_then_the_connection_still_works() -> None:
    async def test(server: Server) -> None:
        conn = await Connection.open("127.0.0.1", server.port)
        with pytest.raises(Timeout):
            await conn.call("slow", encode(0.3), into=memoryview(bytearray(1000)), timeout=0.05)
        await asyncio.sleep(0.4)  # the late reply and its payload arrive and are dropped
        body, _ = await conn.call("echo", encode("next"))
        assert decode(body, str) == "next"
        await conn.close()

    with_server(test)


def test_a_server_that_does_not_know_hello_still_takes_the_connection() -> None:
    """A server from before the hello answers it "unknown operation": an answer in
    plaintext graben all the same, so the client goes on (a rolling upgrade)."""

    async def test() -> None:
        served = asyncio.Event()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read(1 << 16)  # the hello
            unknown = to_wire(InvalidArgument("unknown operation 'hello'"))
            writer.write(frame_prefix(Reply(1, error=unknown), 0))
            await reader.read(1 << 16)  # the call
            writer.write(frame_prefix(Reply(2, body=encode("ok")), 0))
            await reader.read(1 << 16)  # until the client closes
            writer.close()
            await writer.wait_closed()
            served.set()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        conn = await Connection.open("127.0.0.1", port)
        body, _ = await conn.call("echo", token="t")
        assert decode(body, str) == "ok"
        await conn.close()
        await served.wait()
        server.close()
        await server.wait_closed()

    asyncio.run(test())


def test_a_call_given_up_mid_payload_drops_its_connection_and_spares_its_buffer() -> None:
    """A reply whose payload is half in when the caller gives up: the rest must not
    land in a buffer the caller may already have reused (the read of another replica)."""

    async def test() -> None:
        half = asyncio.Event()
        finish = asyncio.Event()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read(1 << 16)  # the client's hello
            writer.write(frame_prefix(Reply(1), 0))
            await reader.read(1 << 16)  # the call
            writer.write(frame_prefix(Reply(2), 2000) + b"a" * 1000)
            await writer.drain()
            half.set()
            await finish.wait()
            writer.write(b"b" * 1000)  # the rest, late
            await writer.drain()
            await asyncio.sleep(0.2)
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        conn = await Connection.open("127.0.0.1", port)
        buffer = bytearray(2000)
        with pytest.raises(Timeout):
            await conn.call("read", into=memoryview(buffer), timeout=0.3)
        assert half.is_set() and conn.closed
        buffer[:] = bytes(2000)  # reused by its owner
        finish.set()
        await asyncio.sleep(0.3)
        assert buffer == bytes(2000)
        server.close()
        await server.wait_closed()

    asyncio.run(test())


@pytest.mark.parametrize(
    "garbage",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        os.urandom(4096),
        PREFIX.pack(MAGIC, 1 << 30, 0),  # header over the limit
        PREFIX.pack(MAGIC, 10, 1 << 40),  # payload over the limit
        PREFIX.pack(MAGIC, 5, 0) + b"\xff\xff\xff\xff\xff",  # undecodable header
        frame_prefix(Reply(1), 0),  # a reply sent to a server
        PREFIX.pack(MAGIC, 200_001, 0) + b"\x91" * 200_000 + b"\xc0",  # nested 200k deep
    ],
)
def test_garbage_drops_that_connection_only(garbage: bytes) -> None:
    async def test(server: Server) -> None:
        good = await Connection.open("127.0.0.1", server.port)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(garbage)
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
        writer.close()
        body, _ = await good.call("echo", encode("fine"))
        assert decode(body, str) == "fine"
        await good.close()

    with_server(test)


def test_a_payload_no_op_takes_is_refused_unread_and_the_connection_goes_on() -> None:
    async def test(server: Server) -> None:
        conn = await Connection.open("127.0.0.1", server.port)
        with pytest.raises(InvalidArgument, match="takes no payload"):
            await conn.call("missing", payload=memoryview(os.urandom(1 << 20)))
        body, _ = await conn.call("echo", encode("after"))
        assert decode(body, str) == "after"
        await conn.close()

    with_server(test)


def test_a_body_larger_than_a_header_travels_as_a_bulk_payload_both_ways() -> None:
    async def test(server: Server) -> None:
        conn = await Connection.open("127.0.0.1", server.port)
        big = {f"key{i}": "v" * 100 for i in range(30_000)}  # ~3.5 MB of msgpack
        body, _ = await conn.call("echo", encode(big))
        assert decode(body, dict) == big
        await conn.close()

    with_server(test)


def test_dropped_connection_fails_calls_in_flight_with_unavailable() -> None:
    async def main() -> None:
        server = await Server.start(HANDLERS, sinks=SINKS)
        conn = await Connection.open("127.0.0.1", server.port)
        pending = asyncio.ensure_future(conn.call("slow", encode(5.0)))
        await asyncio.sleep(0.1)
        await server.close()
        with pytest.raises(Unavailable):
            await asyncio.wait_for(pending, 10)
        with pytest.raises(Unavailable):
            await conn.call("echo")

    asyncio.run(main())


def test_connecting_to_nobody_is_unavailable() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()

    async def main() -> None:
        with pytest.raises(Unavailable, match="cannot connect"):
            await Connection.open("127.0.0.1", port)

    asyncio.run(main())


# -- the parser alone ----------------------------------------------------------


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.aborted = False

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def abort(self) -> None:
        self.aborted = True


FRAMES = st.lists(
    st.tuples(st.integers(1, 10**6), st.text(max_size=30), st.binary(max_size=600_000)),
    min_size=1,
    max_size=6,
)


@settings(max_examples=60, deadline=None)
@given(frames=FRAMES, cuts=st.lists(st.integers(1, 300_000), min_size=1, max_size=40))
def test_parser_reassembles_frames_however_the_stream_is_cut(
    frames: list[tuple[int, str, bytes]], cuts: list[int]
) -> None:
    stream = b"".join(frame_prefix(Call(i, op, encode(op)), len(p)) + p for i, op, p in frames)
    got: list[tuple[Header, bytes | None]] = []
    protocol = FrameProtocol(
        lambda h, n: memoryview(bytearray(n)),
        lambda h, p: got.append((h, None if p is None else bytes(p))),
    )
    transport = _Transport()
    protocol.connection_made(transport)
    pos, cut = 0, 0
    while pos < len(stream):
        size = cuts[cut % len(cuts)]
        cut += 1
        buffer = protocol.get_buffer(size)
        n = min(size, buffer.nbytes, len(stream) - pos)
        buffer[:n] = stream[pos : pos + n]
        protocol.buffer_updated(n)
        pos += n
    assert not transport.aborted
    assert [(h.id, h.op, p or b"") for h, p in got] == [  # type: ignore[union-attr]
        (i, op, p) for i, op, p in frames
    ]
    assert all(msgspec.msgpack.decode(h.body) == h.op for h, _ in got)  # type: ignore[union-attr]


def test_nil_body_decodes_as_none() -> None:
    assert decode(NIL, type(None)) is None


def test_a_body_type_decodes_the_same_and_refuses_the_same_every_time() -> None:
    """``decode`` keeps a decoder per type: the second call of a type (a union of request
    kinds, a list of a struct) decodes and refuses exactly as the first."""
    from graben.store.meta._service import AnyRequest
    from graben.store.transport import ListDir, Stat

    for _ in range(2):
        assert decode(encode(Stat("/a/b")), AnyRequest) == Stat("/a/b")
        assert decode(encode([Stat("/x"), Stat("/y")]), list[Stat]) == [Stat("/x"), Stat("/y")]
        assert decode(encode(ListDir("/d", limit=3)), AnyRequest) == ListDir("/d", limit=3)
        with pytest.raises(GrabenError, match="malformed request body"):
            decode(encode({"type": "Stat", "path": 3}), AnyRequest)
        with pytest.raises(GrabenError, match="undecodable request body"):
            decode(msgspec.Raw(b"\xc1"), list[Stat])


def test_a_periodic_task_outlives_failing_rounds() -> None:
    from graben.store.wire import every, stop

    rounds: list[int] = []

    async def work() -> None:
        rounds.append(len(rounds))
        if len(rounds) == 1:
            raise OSError("disk hiccup")  # not a GrabenError: still must not end the loop
        if len(rounds) == 2:
            raise Unavailable("meta away")

    async def main() -> None:
        task = every(0.01, work, "test", at_once=True)
        for _ in range(200):
            if len(rounds) >= 4:
                break
            await asyncio.sleep(0.01)
        await stop(task)
        assert task.cancelled()

    asyncio.run(main())
    assert len(rounds) >= 4


def test_file_payloads_sent_by_sendfile_interleave_with_other_replies(tmp_path: Path) -> None:
    """A reply whose payload is a span of an open file (a data node's chunk read) arrives
    whole and in place while small replies go out on the same connection; a client that
    leaves mid-file costs the server nothing."""
    data = os.urandom(24 << 20)
    (tmp_path / "chunk").write_bytes(data)

    async def from_file(call: Call, payload: memoryview | None) -> Answer:
        offset, length = decode(call.body, tuple[int, int])
        fd = os.open(tmp_path / "chunk", os.O_RDONLY)
        return Answer(file=FileSpan(fd, offset, length), release=lambda: os.close(fd))

    async def main() -> None:
        server = await Server.start({**HANDLERS, "file": from_file}, sinks=SINKS)
        try:
            conn = await Connection.open("127.0.0.1", server.port)
            spans = [((i * 7919) % (16 << 20), (1 << 20) + i * 4096) for i in range(40)]
            intos = [bytearray(length) for _, length in spans]
            files = [
                conn.call("file", encode(span), into=memoryview(into))
                for span, into in zip(spans, intos, strict=True)
            ]
            echoes = [conn.call("echo", encode(i)) for i in range(400)]
            replies = await asyncio.gather(*files, *echoes)
            for (offset, length), into, (_, n) in zip(
                spans, intos, replies[: len(spans)], strict=True
            ):
                assert n == length and into == data[offset : offset + length]
            assert [decode(b, int) for b, _ in replies[len(spans) :]] == list(range(400))

            # A client that asks for the whole file, reads none of it and leaves while
            # the server is still sending (its socket buffers hold a few MiB at most).
            _, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(frame_prefix(Call(1, "file", encode((0, len(data)))), 0))
            await writer.drain()
            await asyncio.sleep(0.2)
            writer.transport.abort()
            into = bytearray(len(data))
            _, n = await conn.call("file", encode((0, len(data))), into=memoryview(into))
            assert n == len(data) and into == data
            await conn.close()
        finally:
            await server.close()

    asyncio.run(main())


def test_a_reply_that_lands_as_its_deadline_passes_is_the_reply() -> None:
    """The reply is in, and the deadline passes before the caller resumes (both in one
    turn of a busy loop): the caller gets the reply, not asyncio's bare TimeoutError."""

    async def test(server: Server) -> None:
        conn = await Connection.open("127.0.0.1", server.port)
        send = conn._protocol.send

        async def send_then_stall(header: Call, payload: memoryview | None) -> None:
            await send(header, payload)
            while not conn._pending[header.id].replied:
                await asyncio.sleep(0.001)
            await asyncio.sleep(1.0)  # the loop was busy: the deadline passed meanwhile

        conn._protocol.send = send_then_stall  # type: ignore[method-assign]
        body, _ = await conn.call("echo", encode("in time"), timeout=0.2)
        assert decode(body, str) == "in time"
        await conn.close()

    with_server(test)
