"""Requests over the wire: a multiplexed client connection and a server.

Call order (client): ``conn = await Connection.open(host, port)``, then any
number of concurrent ``await conn.call(op, body, payload=..., into=...)``,
then ``await conn.close()``. Replies are matched to calls by id, so one
connection carries many requests at once; a reply's payload lands straight
in the caller's ``into``. A dropped connection fails every call in flight
with ``Unavailable``; a call past its deadline fails with ``Timeout``.

Server: ``await Server.start(handlers, host, port)``. Each ``Call`` runs its
handler in a task of its own; a ``GrabenError`` goes back as the same error,
anything else as an internal error, and a frame that breaks the protocol
drops that connection only. A server never dies of what a peer sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import msgspec

from ._errors import GrabenError, InvalidArgument, ProtocolError, Timeout, Unavailable
from ._wire import NIL, Call, FrameProtocol, Header, Reply, from_wire, to_wire

log = logging.getLogger("graben.rpc")

DEFAULT_TIMEOUT = 60.0
CONNECT_TIMEOUT = 10.0


class Answer(NamedTuple):
    """What a handler returns: a reply body, an optional payload, and a hook
    called once the payload has been sent (to return a pooled buffer)."""

    body: msgspec.Raw = NIL
    payload: memoryview | None = None
    release: Callable[[], None] | None = None


Handler = Callable[[Call, memoryview | None], Awaitable[Answer]]
PayloadSink = Callable[[Call, int], memoryview]


def every(
    seconds: float, work: Callable[[], Awaitable[object]], what: str, *, at_once: bool = False
) -> asyncio.Task[None]:
    """Run ``work`` every ``seconds`` until the task is cancelled.

    A failure is logged and the next round runs anyway: a server's heartbeat
    or repair loop must never die of one bad round.
    """

    async def loop() -> None:
        if not at_once:
            await asyncio.sleep(seconds)
        while True:
            try:
                await work()
            except GrabenError as exc:  # expected now and then (a peer is away): one line
                log.warning("%s failed: %s; trying again in %s s", what, exc, seconds)
            except Exception:  # a bug: the traceback, but the loop lives on
                log.exception("%s failed; trying again in %s s", what, seconds)
            await asyncio.sleep(seconds)

    return asyncio.ensure_future(loop())


async def stop(*tasks: asyncio.Task[None] | None) -> None:
    """Cancel background tasks and wait until they are gone."""
    live = [t for t in tasks if t is not None]
    for task in live:
        task.cancel()
    await asyncio.gather(*live, return_exceptions=True)


@dataclass
class _Pending:
    """A call waiting for its reply."""

    future: asyncio.Future[tuple[msgspec.Raw, int]]
    into: memoryview | None


class Connection:
    """One client connection to a server (see the module docstring)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._protocol = FrameProtocol(self._sink, self._on_frame, self._lost)

    @classmethod
    async def open(cls, host: str, port: int, *, timeout: float = CONNECT_TIMEOUT) -> Connection:
        """Connect; ``Unavailable`` if nobody answers."""
        connection = cls(f"{host}:{port}")
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(
                loop.create_connection(lambda: connection._protocol, host, port), timeout
            )
        except (OSError, TimeoutError) as exc:
            raise Unavailable(f"cannot connect to {connection.where}: {exc}") from None
        return connection

    @property
    def closed(self) -> bool:
        """Whether the connection is gone (calls would fail)."""
        return self._protocol.broken is not None

    async def call(
        self,
        op: str,
        body: msgspec.Raw = NIL,
        *,
        payload: memoryview | None = None,
        into: memoryview | None = None,
        token: str = "",
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> tuple[msgspec.Raw, int]:
        """Send a call; returns the reply body and how many payload bytes landed in ``into``."""
        if self.closed:
            raise Unavailable(f"connection to {self.where} is closed")
        call_id = next(self._ids)
        future: asyncio.Future[tuple[msgspec.Raw, int]] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = _Pending(future, into)
        try:
            await self._protocol.send(Call(call_id, op, body, token), payload)
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise Timeout(f"{op} to {self.where} took longer than {timeout} s") from None
        except ConnectionError:
            raise Unavailable(f"connection to {self.where} lost during {op}") from None
        finally:
            self._pending.pop(call_id, None)
            if future.done() and not future.cancelled():
                future.exception()  # failed while we were not waiting: mark it seen
            else:
                future.cancel()

    async def close(self) -> None:
        """Close the connection; calls in flight fail with ``Unavailable``."""
        if self._protocol.transport is not None:
            self._protocol.transport.close()
        self._fail_all(Unavailable(f"connection to {self.where} closed"))

    # -- protocol callbacks ----------------------------------------------------

    def _sink(self, header: Header, length: int) -> memoryview:
        pending = self._pending.get(header.id) if isinstance(header, Reply) else None
        if pending is None or pending.into is None:
            return memoryview(bytearray(length))  # late reply or no room asked: discard
        if length > pending.into.nbytes:
            raise ProtocolError(
                f"reply payload of {length} bytes for a {pending.into.nbytes}-byte buffer"
            )
        return pending.into[:length]

    def _on_frame(self, header: Header, payload: memoryview | None) -> None:
        if not isinstance(header, Reply):
            self._protocol.fail(ProtocolError("a server sent a call"))
            return
        pending = self._pending.get(header.id)
        if pending is None or pending.future.done():
            return  # the caller gave up (timeout); drop the late reply
        if header.error is not None:
            pending.future.set_exception(from_wire(header.error))
        else:
            pending.future.set_result((header.body, 0 if payload is None else payload.nbytes))

    def _lost(self, exc: BaseException) -> None:
        self._fail_all(Unavailable(f"connection to {self.where} lost: {exc}"))

    def _fail_all(self, exc: GrabenError) -> None:
        for pending in self._pending.values():
            if not pending.future.done():
                pending.future.set_exception(exc)


def _scratch(call: Call, length: int) -> memoryview:
    return memoryview(bytearray(length))


@dataclass
class Server:
    """A listening server dispatching calls to ``handlers`` by op name."""

    handlers: dict[str, Handler]
    sinks: dict[str, PayloadSink] = field(default_factory=dict)
    """Where each op's request payload goes (default: a new buffer)."""
    server: asyncio.Server | None = None
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    sessions: set[_Session] = field(default_factory=set)

    @classmethod
    async def start(
        cls,
        handlers: dict[str, Handler],
        host: str = "127.0.0.1",
        port: int = 0,
        sinks: dict[str, PayloadSink] | None = None,
    ) -> Server:
        """Listen on ``host:port`` (0: any free port; see ``port``)."""
        server = cls(handlers, sinks or {})
        loop = asyncio.get_running_loop()
        server.server = await loop.create_server(server._protocol, host, port)
        return server

    @property
    def port(self) -> int:
        """The port listened on."""
        assert self.server is not None
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def close(self) -> None:
        """Stop listening, drop every connection and cancel handlers in flight."""
        if self.server is not None:
            self.server.close()
        for session in list(self.sessions):
            session.protocol.fail(Unavailable("server shutting down"))
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.server is not None:
            await self.server.wait_closed()

    def _protocol(self) -> FrameProtocol:
        return _Session(self).protocol

    async def answer(self, call: Call, payload: memoryview | None) -> tuple[Reply, Answer]:
        """Run the call's handler; the reply header and what goes with it."""
        handler = self.handlers.get(call.op)
        try:
            if handler is None:
                raise InvalidArgument(f"unknown operation {call.op!r}")
            answer = Answer(*await handler(call, payload))
        except GrabenError as exc:
            return Reply(call.id, error=to_wire(exc)), Answer()
        except Exception as exc:  # a bug here must not take the server down
            log.exception("handler for %s failed", call.op)
            error = to_wire(GrabenError(f"internal error: {exc!r}"))
            return Reply(call.id, error=error), Answer()
        return Reply(call.id, answer.body), answer


class _Session:
    """The server's side of one client connection."""

    def __init__(self, server: Server) -> None:
        self._server = server
        self.protocol = FrameProtocol(self._sink, self._on_frame, self._lost)
        server.sessions.add(self)

    def _lost(self, exc: BaseException) -> None:
        self._server.sessions.discard(self)

    def _sink(self, header: Header, length: int) -> memoryview:
        if not isinstance(header, Call):
            raise ProtocolError("a client sent a reply")
        return self._server.sinks.get(header.op, _scratch)(header, length)

    def _on_frame(self, header: Header, payload: memoryview | None) -> None:
        if not isinstance(header, Call):
            self.protocol.fail(ProtocolError("a client sent a reply"))
            return
        task = asyncio.ensure_future(self._serve(header, payload))
        self._server.tasks.add(task)
        task.add_done_callback(self._server.tasks.discard)

    async def _serve(self, call: Call, payload: memoryview | None) -> None:
        reply, answer = await self._server.answer(call, payload)
        try:
            with contextlib.suppress(ConnectionError):  # the client went away: nothing to tell
                await self.protocol.send(reply, answer.payload)
        finally:
            if answer.release is not None:
                answer.release()
