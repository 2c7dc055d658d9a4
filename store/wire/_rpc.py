"""Requests over the wire: a multiplexed client connection and a server (their
periodic tasks: ``_tasks``).

Call order (client): ``conn = await Connection.open(host, port)``, then any
number of concurrent ``await conn.call(op, body, payload=..., into=...)``,
then ``await conn.close()``. Replies are matched to calls by id, so one
connection carries many requests at once; a reply's payload lands straight
in the caller's ``into``. A dropped connection fails every call in flight
with ``Unavailable``; a call past its deadline fails with ``Timeout``; TLS
that fails is a ``TLSError`` (``_tls``). Both ends take ``tls=`` a context.

Server: ``await Server.start(handlers, host, port)``. Each ``Call`` runs its
handler in a task of its own; a ``GrabenError`` goes back as the same error,
anything else as an internal error, and a frame that breaks the protocol
drops that connection only. A server never dies of what a peer sends.

Over 500 lines: the client's connection and the server are the two ends of
one call protocol (ids, deadlines, payloads landing in place, refusals before
a payload is read), and read best side by side; ``_tasks`` already holds the
server's periodic work.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import logging
import os
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import msgspec

from .._errors import (
    GrabenError,
    InvalidArgument,
    ProtocolError,
    Timeout,
    TLSError,
    Unavailable,
)
from ._budget import MemoryBudget
from ._frames import (
    INLINE_BODY_MAX,
    NIL,
    SERVER_INBOX,
    Call,
    FileSpan,
    FrameProtocol,
    Header,
    Reply,
    from_wire,
    to_wire,
)
from ._metrics import Metrics  # cheap: prometheus_client is imported only when used
from ._tasks import every, stop
from ._tls import HANDSHAKE_TIMEOUT_S, failure, lost

log = logging.getLogger("graben.rpc")
_WARNED: set[str] = set()  # hosts already warned about: once per process is enough

LISTEN_BACKLOG = 4096
"""Connections a server's kernel queues before it accepts them (capped by somaxconn):
a thousand ranks connect at once, and asyncio's default of 100 drops the rest."""
DEFAULT_TIMEOUT = 60.0
HELLO = "hello"
"""The op every server answers, to anyone: a plaintext client sends it, with no token,
before any call that carries one (a TLS port would take the token in the clear)."""
CONNECT_TIMEOUT = 10.0
DEFAULT_BUDGET = 1 << 30
"""Bytes of request payloads (and large headers) a server holds at once."""
HEADER_BUDGET = 64 << 20
"""Bytes of receive buffers grown for large headers a server holds at once."""
MAX_BULK = 64 << 20
"""Largest request body a server takes (as a bulk payload)."""
DEFAULT_IDLE_TIMEOUT = 300.0
"""Seconds a server keeps a connection that sends nothing and waits for nothing."""
CLIENT_IDLE_S = 120.0
"""Clients reopen connections idle this long, before a server would drop them."""
HEADER_DEADLINE_S = 30.0
"""Seconds a connection may hold a grown inbox waiting for one large header."""


class Answer(NamedTuple):
    """What a handler returns: a reply body, an optional payload (bytes in memory, or
    ``file``: bytes of an open file, sent by ``sendfile``), and a hook called once the
    payload has been sent (to return a pooled buffer, close the file)."""

    body: msgspec.Raw = NIL
    payload: memoryview | None = None
    release: Callable[[], None] | None = None
    file: FileSpan | None = None


Handler = Callable[[Call, memoryview | None], Awaitable[Answer]]
PayloadSink = Callable[[Call, int], memoryview]
Admit = Callable[[Call, int], None]
"""Checks a call whose payload of ``n`` bytes is about to arrive; raises to refuse."""
Label = Callable[[Call], str]
"""A known op's name in the metrics (the metadata service adds its request's type)."""


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@dataclass
class _Pending:
    """A call waiting for its reply."""

    future: asyncio.Future[tuple[msgspec.Raw, int]]
    into: memoryview | None
    replied: bool = False  # the server answered: an error it sent is its answer
    landing: bool = False  # the reply's payload is arriving in ``into``
    progress: Callable[[int], None] | None = None  # told the bytes landed so far


def _why(exc: OSError, timeout: float) -> str:
    """Why a connect failed, in the system's words ("Connection refused"), not
    asyncio's ("[Errno 111] Connect call failed ('127.0.0.1', 1)")."""
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout:g} s"
    if isinstance(exc, socket.gaierror):  # its errno is getaddrinfo's, not the system's
        return f"cannot resolve the host name ({(exc.strerror or str(exc)).lower()})"
    if exc.errno:
        return os.strerror(exc.errno).lower()
    return str(exc)


class Connection:
    """One client connection to a server (see the module docstring)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._protocol = FrameProtocol(self._sink, self._on_frame, self._lost, on_fill=self._fill)
        self.last_used = time.monotonic()
        """When a call last went out (pools drop connections idle for long)."""

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        *,
        timeout: float = CONNECT_TIMEOUT,
        tls: ssl.SSLContext | None = None,
    ) -> Connection:
        """Connect (over TLS with a client context ``tls``: the server's certificate
        must name ``host``); ``Unavailable`` if nobody answers, ``TLSError`` if TLS fails."""
        connection = cls(f"{host}:{port}")
        loop = asyncio.get_running_loop()
        named = None if tls is None else host  # the name the server's certificate must hold
        try:
            await asyncio.wait_for(
                loop.create_connection(
                    lambda: connection._protocol, host, port, ssl=tls, server_hostname=named
                ),
                timeout,
            )
        except ssl.SSLError as exc:  # before OSError, which it is too
            raise failure(exc, connection.where) from None
        except (OSError, TimeoutError) as exc:
            raise Unavailable(
                f"cannot connect to {connection.where}: {_why(exc, timeout)}"
            ) from None
        if tls is None:
            await connection._greet(host, timeout)
        return connection

    async def _greet(self, host: str, timeout: float) -> None:
        """Make sure the peer is a plaintext graben server before a token goes out."""
        try:
            await self.call(HELLO, timeout=timeout)
        except InvalidArgument:  # an older server: "unknown operation" is a graben answer
            pass
        except Timeout:
            await self.close()
            raise Unavailable(
                f"{self.where} accepted the connection but did not answer within "
                f"{timeout:.1f} s (a hung or overloaded server?); nothing secret was sent"
            ) from None
        except (ProtocolError, Unavailable) as exc:
            await self.close()
            kind = TLSError if isinstance(exc, ProtocolError) else Unavailable
            raise kind(
                f"{self.where} did not answer a plaintext hello ({exc.message}); nothing "
                "secret was sent. If it is a TLS port, connect with TLS (tls=TLS(ca=...), "
                "$GRABEN_TLS_CA, --tls-ca)"
            ) from None
        if not _loopback(host) and host not in _WARNED:
            _WARNED.add(host)
            log.warning(
                "talking to %s without TLS: tokens and data cross the network in the clear "
                "(turn TLS on: docs/cluster.md#tls)",
                self.where,
            )

    @property
    def closed(self) -> bool:
        """Whether the connection is gone (calls would fail)."""
        return self._protocol.broken is not None

    @property
    def idle_s(self) -> float:
        """Seconds since the connection was last used (0 while calls are in flight)."""
        if self._pending:
            return 0.0
        return time.monotonic() - max(self.last_used, self._protocol.last_active)

    async def call(
        self,
        op: str,
        body: msgspec.Raw = NIL,
        *,
        payload: memoryview | None = None,
        into: memoryview | None = None,
        token: str = "",
        timeout: float | None = DEFAULT_TIMEOUT,
        progress: Callable[[int], None] | None = None,
    ) -> tuple[msgspec.Raw, int]:
        """Send a call; returns the reply body and how many payload bytes landed in ``into``
        (``progress`` is told how many have, as they land: a checksum may follow them)."""
        if self.closed:
            raise Unavailable(f"connection to {self.where} is closed")
        call_id = next(self._ids)
        future: asyncio.Future[tuple[msgspec.Raw, int]] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = pending = _Pending(future, into, progress=progress)
        self.last_used = time.monotonic()
        header = Call(call_id, op, body, token)
        if payload is None and len(body) > INLINE_BODY_MAX:
            header, payload = Call(call_id, op, NIL, token, bulk=True), memoryview(body)
        sent = False
        try:
            # The deadline covers the send too: a peer cut off (a pulled cable, no
            # reset) stops taking bytes, and the kernel would wait ~15 min to say so.
            async with asyncio.timeout(timeout):
                await self._protocol.send(header, payload)
                sent = True
                return await future
        except (TimeoutError, ConnectionError) as exc:
            if pending.replied and isinstance(exc, GrabenError):
                raise  # the server's own error reply, told as it was sent
            if (
                pending.replied
                and future.done()
                and not future.cancelled()
                and not future.exception()
            ):
                return future.result()  # in before the deadline, which passed as it landed
            if isinstance(exc, TimeoutError):
                if not sent or pending.landing:  # frames queued behind would wait as
                    # long; the rest of a payload would land in a buffer given up
                    self._protocol.fail(ConnectionResetError(f"{op} timed out"))
                raise Timeout(f"{op} to {self.where} took longer than {timeout:.3g} s") from None
            why = exc.message if isinstance(exc, GrabenError) else str(exc) or type(exc).__name__
            raise Unavailable(f"{op} to {self.where} failed: {why}") from None
        except asyncio.CancelledError:  # given up, the buffer may be reused: cut the rest
            if pending.landing and not future.done():
                self._protocol.fail(ConnectionResetError(f"{op} was given up"))
            raise
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
        if pending is None or pending.into is None or header.bulk:
            return memoryview(bytearray(length))  # late reply or no room asked: discard
        if length > pending.into.nbytes:
            raise ProtocolError(
                f"reply payload of {length} bytes for a {pending.into.nbytes}-byte buffer"
            )
        pending.landing = True
        return pending.into[:length]

    def _fill(self, header: Header, filled: int) -> None:
        pending = self._pending.get(header.id)
        if pending is not None and pending.progress is not None:
            pending.progress(filled)

    def _on_frame(self, header: Header, payload: memoryview | None) -> None:
        if not isinstance(header, Reply):
            self._protocol.fail(ProtocolError("a server sent a call"))
            return
        pending = self._pending.get(header.id)
        if pending is None or pending.future.done():
            return  # the caller gave up (timeout); drop the late reply
        pending.replied = True
        if header.error is not None:
            pending.future.set_exception(from_wire(header.error))
        elif header.bulk:
            pending.future.set_result((msgspec.Raw(b"" if payload is None else payload), 0))
        else:
            pending.future.set_result((header.body, 0 if payload is None else payload.nbytes))

    def _lost(self, exc: BaseException) -> None:
        self._fail_all(lost(exc, self.where))

    def _fail_all(self, exc: GrabenError) -> None:
        for pending in self._pending.values():
            if not pending.future.done():
                pending.future.set_exception(exc)


@dataclass
class Server:
    """A listening server dispatching calls to ``handlers`` by op name.

    What a peer can make the server hold is bounded before anything is
    allocated: a payload goes only to an op with a sink (or a bulk body, at
    most ``MAX_BULK`` bytes), after ``admit`` accepted the call (its token or
    capability, its size); payloads in flight share one ``MemoryBudget``
    (a connection over it waits, reading nothing); connections idle for
    ``idle_timeout`` seconds, or stuck in one large header for
    ``HEADER_DEADLINE_S``, are dropped.
    """

    handlers: dict[str, Handler]
    sinks: dict[str, PayloadSink] = field(default_factory=dict)
    """Where each op's request payload goes (ops without one take no payload)."""
    admit: Admit | None = None
    """Checks a call before its payload is received (raises to refuse it)."""
    budget: MemoryBudget = field(default_factory=lambda: MemoryBudget(DEFAULT_BUDGET))
    """Request payloads in flight (authenticated peers only)."""
    headers: MemoryBudget = field(default_factory=lambda: MemoryBudget(HEADER_BUDGET))
    """Receive buffers grown past their base for large headers (anyone may ask)."""
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    metrics: Metrics | None = None
    """Where each request answered is counted (``None``: nowhere)."""
    label: Label | None = None
    """A known op's name in the metrics (default: the op)."""
    server: asyncio.Server | None = None
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    sessions: set[_Session] = field(default_factory=set)
    _sweeping: asyncio.Task[None] | None = None

    @classmethod
    async def start(
        cls,
        handlers: dict[str, Handler],
        host: str = "127.0.0.1",
        port: int = 0,
        sinks: dict[str, PayloadSink] | None = None,
        *,
        admit: Admit | None = None,
        budget: int = DEFAULT_BUDGET,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        metrics: Metrics | None = None,
        label: Label | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> Server:
        """Listen on ``host:port`` (0: any free port; see ``port``); with a server
        context ``tls``, for TLS connections only."""
        server = cls(
            handlers,
            sinks or {},
            admit,
            MemoryBudget(budget),
            idle_timeout=idle_timeout,
            metrics=metrics,
            label=label,
        )
        loop = asyncio.get_running_loop()
        handshake = None if tls is None else HANDSHAKE_TIMEOUT_S
        try:
            server.server = await loop.create_server(
                server._protocol,
                host,
                port,
                ssl=tls,
                ssl_handshake_timeout=handshake,
                backlog=LISTEN_BACKLOG,
            )
        except OSError as exc:
            raise Unavailable(f"cannot listen on {host}:{port}: {exc.strerror}") from None
        server._sweeping = every(min(5.0, idle_timeout / 4), server._sweep, "idle sweep")
        return server

    @property
    def port(self) -> int:
        """The port listened on."""
        assert self.server is not None
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def close(self) -> None:
        """Stop listening, drop every connection and cancel handlers in flight."""
        await stop(self._sweeping)
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

    async def _sweep(self) -> None:
        now = time.monotonic()
        for session in list(self.sessions):
            protocol = session.protocol
            grown = protocol.grown_since
            if grown is not None and now - grown > HEADER_DEADLINE_S:
                protocol.fail(Timeout("a frame header took too long to arrive"))
            elif not session.busy and now - protocol.last_active > self.idle_timeout:
                protocol.fail(Timeout(f"idle for over {self.idle_timeout} s"))

    async def answer(self, call: Call, payload: memoryview | None) -> tuple[Reply, Answer]:
        """Run the call's handler; the reply header and what goes with it (counted in
        the metrics, if any)."""
        if self.metrics is None:
            return await self._answer(call, payload)
        # Sized before the handler runs: handlers release the payload they were given.
        received = len(call.body) + (0 if payload is None else payload.nbytes)
        began = time.perf_counter()
        reply, answer = await self._answer(call, payload)
        self.metrics.observe(
            self._label_of(call),
            "ok" if reply.error is None else reply.error.code,
            time.perf_counter() - began,
            received,
            len(reply.body) + _payload_size(answer),
        )
        return reply, answer

    def _label_of(self, call: Call) -> str:
        # A peer may send any op name: unknown ones share one label, so a peer
        # cannot grow the metrics without bound.
        if call.op not in self.handlers:
            return "unknown"
        return call.op if self.label is None else self.label(call)

    async def _answer(self, call: Call, payload: memoryview | None) -> tuple[Reply, Answer]:
        handler = self.handlers.get(call.op)
        try:
            if call.op == HELLO:  # anyone may ask: it proves a plaintext graben server
                return Reply(call.id), Answer()
            if handler is None:
                raise InvalidArgument(f"unknown operation {call.op!r}")
            answer = Answer(*await handler(call, payload))
        except GrabenError as exc:
            return Reply(call.id, error=to_wire(exc)), Answer()
        except Exception as exc:  # a bug here must not take the server down
            log.exception("handler for %s failed", call.op)
            error = to_wire(GrabenError(f"internal error: {exc!r}"))
            return Reply(call.id, error=error), Answer()
        if answer.payload is None and len(answer.body) > INLINE_BODY_MAX:
            return Reply(call.id, bulk=True), Answer(payload=memoryview(answer.body))
        return Reply(call.id, answer.body), answer


class _Session:
    """The server's side of one client connection."""

    def __init__(self, server: Server) -> None:
        self._server = server
        self.protocol = FrameProtocol(
            self._sink,
            self._on_frame,
            self._lost,
            inbox=SERVER_INBOX,
            budget=server.headers,
            on_refused=self._on_refused,
            on_made=self._made,
        )
        self._receiving = 0  # budget held for the payload arriving now
        self.calls = 0  # calls being served

    def _made(self) -> None:
        # Counted once connected: a TLS handshake that fails never gets here, and
        # must leave nothing behind in the server.
        self._server.sessions.add(self)

    @property
    def busy(self) -> bool:
        """Whether a call is being received or served (then it is not idle)."""
        return bool(self.calls or self._receiving)

    def _lost(self, exc: BaseException) -> None:
        self._server.sessions.discard(self)
        self._give(self._receiving)
        self._receiving = 0

    def _give(self, n: int) -> None:
        if n:
            self._server.budget.give(n)

    def _sink(self, header: Header, length: int) -> memoryview | None:
        if not isinstance(header, Call):
            raise ProtocolError("a client sent a reply")
        sink = _bulk_sink if header.bulk else self._server.sinks.get(header.op)
        if sink is None:
            raise InvalidArgument(f"operation {header.op!r} takes no payload")
        if header.bulk and length > MAX_BULK:
            raise InvalidArgument(f"a request body of {length} bytes is over {MAX_BULK}")
        if self._server.admit is not None:
            self._server.admit(header, length)
        if not self._server.budget.take(length, self.protocol.retry):
            return None
        try:
            view = sink(header, length)
        except BaseException:
            self._give(length)
            raise
        self._receiving = length
        return view

    def _on_refused(self, header: Header, exc: GrabenError) -> None:
        assert isinstance(header, Call)
        self._start(self._refuse(header, exc), 0)

    async def _refuse(self, call: Call, exc: GrabenError) -> None:
        with contextlib.suppress(ConnectionError):
            await self.protocol.send(Reply(call.id, error=to_wire(exc)))

    def _on_frame(self, header: Header, payload: memoryview | None) -> None:
        if not isinstance(header, Call):
            self.protocol.fail(ProtocolError("a client sent a reply"))
            return
        held, self._receiving = self._receiving, 0
        if header.bulk:
            # The bulk buffer is this frame's own (not pooled): the body keeps it, uncopied.
            body = msgspec.Raw(b"" if payload is None else payload)
            header, payload = msgspec.structs.replace(header, body=body, bulk=False), None
        self._start(self._serve(header, payload), held)

    def _start(self, work: Awaitable[None], held: int) -> None:
        self.calls += 1

        async def run() -> None:
            try:
                await work
            finally:
                self.calls -= 1
                self._give(held)

        task = asyncio.ensure_future(run())
        self._server.tasks.add(task)
        task.add_done_callback(self._server.tasks.discard)

    async def _serve(self, call: Call, payload: memoryview | None) -> None:
        reply, answer = await self._server.answer(call, payload)
        try:
            with contextlib.suppress(ConnectionError):  # the client went away: nothing to tell
                if answer.file is not None:
                    await self.protocol.send_file(reply, answer.file)
                else:
                    await self.protocol.send(reply, answer.payload)
        finally:
            if answer.release is not None:
                answer.release()


def _payload_size(answer: Answer) -> int:
    if answer.file is not None:
        return answer.file.length
    return 0 if answer.payload is None else answer.payload.nbytes


def _bulk_sink(call: Call, length: int) -> memoryview:
    return memoryview(bytearray(length))
