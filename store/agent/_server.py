"""The agent's server: ranks reserve, finish, find and read back segments; peers copy them.

A rank's ops (the cluster's token, or a tenant's for a job in its prefix:
``_tokens``): ``agent.reserve`` (a file to write a segment into, room made
under the limit, else ``NoSpace``), ``agent.forget`` (a reserved segment never
written, given back), ``agent.drop`` (every segment of a job), ``agent.done``
(the segment is complete; the agent hashes the ranges its writer named, after
the reply, then a copy goes to the first peer that takes it, in the
background), ``agent.stored`` (the store holds a step: older segments may go),
``agent.steps`` (complete steps of a rank, here or at a peer), ``agent.locate``
(the file of a complete segment and its ranges' blake3s, once hashed; pulled
from a peer first if only a peer has it, and checked), ``agent.list``. The
cluster's token only: ``agent.status``, ``agent.held`` (every segment held: the
status page's); between agents ``agent.has``, ``agent.put`` (a piece of a copy,
received in place) and ``agent.get`` (a piece sent from the file by ``sendfile``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

from .._errors import (
    GrabenError,
    IntegrityError,
    InvalidArgument,
    NoSpace,
    NotFound,
    PermissionDenied,
    ProtocolError,
    Timeout,
)
from ..transport import Done, Held, JobRank, Located, Piece, Reserve, SegmentKey, Status, Stored
from ..wire import (
    Answer,
    Call,
    Connection,
    FileSpan,
    Handler,
    Metrics,
    Server,
    auth,
    decode,
    encode,
    serve_if_asked,
)
from ._segments import Segments
from ._shelf import Room, room, surplus
from ._tokens import Tokens, allow

log = logging.getLogger("graben.agent")

PIECE = 16 << 20
"""Bytes of a segment per call between peers."""
PEER_TIMEOUT_S = 2.0
"""Seconds a peer has to answer a question, connecting included (a copy's pieces get the
wire's default): under a rank's own deadline, so a hung peer never costs a rank the
answer about its own memory."""
RIGHTS: dict[str, tuple[str, Any]] = {
    "agent.reserve": ("w", Reserve),
    "agent.done": ("w", Done),
    "agent.forget": ("w", SegmentKey),
    "agent.drop": ("w", str),
    "agent.stored": ("w", Stored),
    "agent.steps": ("r", JobRank),
    "agent.locate": ("r", SegmentKey),
    "agent.list": ("r", str),
}
"""A rank's ops: the right a tenant's token needs for the job its body names, and the
body's type. Every other op is the cluster token's only."""


class Agent:
    """A node's memory tier (see the package docstring): ``await Agent(...).start(host, port)``."""

    def __init__(
        self,
        root: Path,
        *,
        limit: int,
        secret: bytes,
        keep: int = 2,
        peers: tuple[str, ...] = (),
        metrics_at: tuple[str, int] | None = None,
        meta: tuple[tuple[str, int], ...] = (),
    ) -> None:
        """``meta``: the metadata services that say what a tenant's token reaches (without
        them, only the cluster's token is taken)."""
        self.segments = Segments(root, secret)
        self.limit, self.keep, self.peers = limit, keep, peers
        self._secret = secret
        self._tokens = Tokens(secret, meta)
        self._stored: dict[str, int] = {}
        self._conns: dict[str, Connection] = {}
        self._pushes: asyncio.Queue[SegmentKey] | None = None
        self._pusher: asyncio.Task[None] | None = None
        self.server: Server | None = None
        self.metrics = Metrics() if metrics_at is not None else None
        self._metrics_at = metrics_at
        self._counts: dict[str, Any] = {}
        self._sending: set[SegmentKey] = set()
        """Own segments being copied to a peer: never dropped nor reused meanwhile."""
        self._sealing: dict[SegmentKey, asyncio.Task[None]] = {}
        """Own segments done and being hashed: never dropped nor reused meanwhile."""
        if self.segments.used > limit:
            log.warning("found %d bytes of segments, over the limit %d", self.segments.used, limit)

    async def start(self, host: str, port: int) -> Server:
        handlers = {
            name.replace("_", "."): self._checked(name.replace("_", "."), getattr(self, name))
            for name in [
                "agent_reserve",
                "agent_done",
                "agent_forget",
                "agent_drop",
                "agent_stored",
                "agent_steps",
                "agent_locate",
                "agent_list",
                "agent_status",
                "agent_held",
                "agent_has",
                "agent_put",
                "agent_get",
            ]
        }
        self._serve_metrics()
        self.server = await Server.start(
            handlers,
            host,
            port,
            {"agent.put": self._sink},
            admit=self._admit,
            metrics=self.metrics,
        )
        serve_if_asked(self.metrics, self._metrics_at, self.server.port)
        self._pushes = asyncio.Queue()
        self._pusher = asyncio.create_task(self._push_all())
        return self.server

    async def close(self) -> None:
        if self._pusher is not None:
            self._pusher.cancel()
        if self.server is not None:
            await self.server.close()
        for conn in self._conns.values():
            await conn.close()
        await self._tokens.close()
        if self.metrics is not None:
            self.metrics.close()
        self.segments.close()

    # -- ranks --------------------------------------------------------------------

    async def agent_reserve(self, call: Call, payload: memoryview | None) -> Answer:
        request: Reserve = decode(call.body, Reserve)
        path = await self._make_room(request.key.check(), request.size, False, request.to_store)
        return Answer(encode(str(path)))

    async def agent_done(self, call: Call, payload: memoryview | None) -> Answer:
        done: Done = decode(call.body, Done)
        key, reserved = done.key, self.segments.held.get((done.key, False))
        done.check(reserved.size if reserved is not None else 0)
        held = self.segments.complete(key, False)
        if held is None:
            raise NotFound(f"no segment reserved for {_named(key)}")
        if key not in self._sealing and (key, False) not in self.segments.sums:
            self.segments.intend(held, done.ranges)  # hashed after a restart if not before
            self._sealing[key] = asyncio.create_task(self._seal(held, done.ranges))
        self._tidy(key)
        return Answer()

    async def _seal(self, held: Held, ranges: list[tuple[int, int]]) -> None:
        """Hash the ranges of a segment just done and record their sums; then copy it to a
        peer. Its writer does not wait for this; a reader's ``locate`` does."""
        try:
            sums = await asyncio.to_thread(self.segments.hash, held, ranges)
            if self.segments.held.get((held.key, False)) == held:
                self.segments.seal(held, sums)
                if self.peers and self._pushes is not None:
                    self._pushes.put_nowait(held.key)
        except GrabenError as exc:
            log.warning("%s is not kept: its sums were not recorded (%s)", _named(held.key), exc)
            self.segments.drop(held)
        finally:
            del self._sealing[held.key]

    async def agent_forget(self, call: Call, payload: memoryview | None) -> Answer:
        key: SegmentKey = decode(call.body, SegmentKey)
        held = self.segments.held.get((key, False))
        if held is not None and not held.complete:
            self.segments.drop(held)
        return Answer()

    async def agent_drop(self, call: Call, payload: memoryview | None) -> Answer:
        job: str = decode(call.body, str)
        gone = [h for h in self.segments.held.values() if h.key.job == job]
        for held in gone:
            self.segments.drop(held)
        return Answer(encode(len(gone)))

    async def agent_stored(self, call: Call, payload: memoryview | None) -> Answer:
        stored: Stored = decode(call.body, Stored)
        self._stored[stored.job] = max(stored.step, self._stored.get(stored.job, -1))
        self._count("stored", "Steps ranks reported the store holds")
        self._tidy()
        return Answer()

    async def agent_steps(self, call: Call, payload: memoryview | None) -> Answer:
        which: JobRank = decode(call.body, JobRank)
        steps = self.segments.steps(which.job, which.rank, which.world)
        asked = [self._ask(peer, "agent.has", which, list[int]) for peer in self.peers]
        for peer, said in zip(
            self.peers, await asyncio.gather(*asked, return_exceptions=True), strict=True
        ):
            if isinstance(said, BaseException):
                log.info("peer %s did not say what it holds: %s", peer, said)
            else:
                steps |= set(said)
        return Answer(encode(sorted(steps)))

    async def agent_locate(self, call: Call, payload: memoryview | None) -> Answer:
        key: SegmentKey = decode(call.body, SegmentKey).check()
        sealing = self._sealing.get(key)
        if sealing is not None:
            await asyncio.shield(sealing)
        held = self.segments.find(key) or await self._pull(key)
        sums = self.segments.sums.get((key, held.peer))
        if sums is None:
            raise NotFound(f"segment {_named(key)} was never hashed: it cannot be checked")
        path = str(self.segments.path(key, held.peer, True))
        return Answer(encode(Located(path, held.size, sums)))

    async def agent_list(self, call: Call, payload: memoryview | None) -> Answer:
        job: str = decode(call.body, str)
        return Answer(encode([h for h in self.segments.held.values() if h.key.job == job]))

    async def agent_held(self, call: Call, payload: memoryview | None) -> Answer:
        return Answer(encode(list(self.segments.held.values())))

    async def agent_status(self, call: Call, payload: memoryview | None) -> Answer:
        held = self.segments.held
        return Answer(encode(Status(self.segments.used, self.limit, len(held), list(self.peers))))

    # -- peers --------------------------------------------------------------------

    async def agent_has(self, call: Call, payload: memoryview | None) -> Answer:
        which: JobRank = decode(call.body, JobRank)
        return Answer(encode(sorted(self.segments.steps(which.job, which.rank, which.world))))

    async def agent_put(self, call: Call, payload: memoryview | None) -> Answer:
        piece: Piece = decode(call.body, Piece)
        key = piece.key.check()
        if piece.offset == 0:
            await self._make_room(key, piece.size, True)
        held = self.segments.held.get((key, True))
        if held is None or held.complete or held.size != piece.size:
            raise InvalidArgument(f"no copy of {_named(key)} under way at offset {piece.offset}")
        if payload is None or payload.nbytes != piece.length:
            raise ProtocolError(f"agent.put: a piece of {piece.length} bytes came without them")
        path = self.segments.path(key, True, False)
        await asyncio.to_thread(_write_at, path, payload, piece.offset)
        if piece.offset + piece.length == piece.size:
            copy = self.segments.complete(key, peer=True)
            assert copy is not None
            await self._check_copy(copy, piece.sums)
            self._tidy(key)
        return Answer()

    async def agent_get(self, call: Call, payload: memoryview | None) -> Answer:
        piece: Piece = decode(call.body, Piece)
        held = self.segments.find(piece.key)
        if held is None or not 0 <= piece.offset <= piece.offset + piece.length <= held.size:
            raise NotFound(f"no segment {_named(piece.key)} holding those bytes")
        fd = os.open(self.segments.path(held.key, held.peer, True), _READ)
        return Answer(file=FileSpan(fd, piece.offset, piece.length), release=lambda: os.close(fd))

    async def _check_copy(self, held: Held, sums: list[tuple[int, int, bytes]]) -> None:
        """Keep a copy that came from a peer if its ranges hash to ``sums``; else drop it."""
        if not sums:
            self.segments.drop(held)
            raise InvalidArgument(f"a copy of {_named(held.key)} came without its sums")
        ranges = [(offset, length) for offset, length, _ in sums]
        found = await asyncio.to_thread(self.segments.hash, held, ranges)
        if found != sums:
            self.segments.drop(held)
            raise IntegrityError(f"a copy of {_named(held.key)} differs from its sums: dropped")
        self.segments.seal(held, sums)

    def _checked(self, op: str, handler: Handler) -> Handler:
        """``handler`` behind the call's token: the cluster's, or a tenant's reaching the
        job of a rank's op (``RIGHTS``; a payload's call is checked earlier too)."""

        async def checked(call: Call, payload: memoryview | None) -> Answer:
            tenant = await self._tokens.scope(call.token)
            if tenant is not None:
                if op not in RIGHTS:
                    raise PermissionDenied(
                        f"{op} needs the cluster's secret, not tenant {tenant.tenant}'s token"
                    )
                right, body = RIGHTS[op]
                allow(tenant, right, _job_of(decode(call.body, body)))
            return await handler(call, payload)

        return checked

    def _admit(self, call: Call, length: int) -> None:
        auth.check_token(self._secret, call.token)
        if call.op == "agent.put":
            piece: Piece = decode(call.body, Piece)
            if piece.length != length or not 0 < length <= PIECE:
                raise ProtocolError(f"agent.put: {length} bytes for a piece of {piece.length}")

    def _sink(self, call: Call, length: int) -> memoryview:
        return memoryview(bytearray(length))

    # -- helpers ------------------------------------------------------------------

    async def _make_room(
        self, key: SegmentKey, size: int, peer: bool, to_store: bool = True
    ) -> Path:
        if not 0 <= size <= self.limit:
            self._count("refused", "Segments refused for want of memory")
            raise NoSpace(f"a segment of {size} bytes is over the agent's limit of {self.limit}")
        self.segments.forget(key, peer)
        fit = self._room(key, size)
        for _ in range(3):
            if fit is not None or not self._sealing:
                break
            # a segment being hashed may not go yet; once hashed, it may (a busy host's
            # rank saving again straight after ``done`` should wait for that, not fail)
            await asyncio.wait(list(self._sealing.values()))
            fit = self._room(key, size)
        if fit is None:
            self._count("refused", "Segments refused for want of memory")
            raise NoSpace(
                f"the memory agent holds {self.segments.used} of {self.limit} bytes in "
                f"segments it must keep; no room for {size} more ({_named(key)})"
            )
        for held in fit.drop:
            self.segments.drop(held)
        return self.segments.create(key, size, peer, fit.reuse, to_store)

    def _room(self, key: SegmentKey, size: int) -> Room | None:
        """How ``key``'s segment fits: within its own rank's segments where they make the
        room (a rank saving again: its old segment's pages), else among all of them."""
        line = self.segments.held.line(key)
        others = self.segments.used - sum(h.size for h in line)
        args = (self._stored, self.keep, self._pinned)
        fit = room(key, line, size, self.limit - others, *args)
        if fit is not None:
            return fit
        return room(key, self.segments.held.values(), size, self.limit, *args)

    @property
    def _pinned(self) -> set[SegmentKey]:
        """Own segments never dropped nor reused now: being hashed, or copied to a peer."""
        return self._sending | self._sealing.keys()

    def _tidy(self, key: SegmentKey | None = None) -> None:
        """Drop what may go now: of ``key``'s rank (what one rank's call changed), else of
        every rank (the rules are each rank's own)."""
        some = self.segments.held.line(key) if key is not None else self.segments.held.values()
        for held in surplus(some, self._stored, self.keep, self._pinned):
            self.segments.drop(held)

    async def _push_all(self) -> None:
        assert self._pushes is not None
        while True:
            key = await self._pushes.get()
            self._sending.add(key)
            try:
                for peer in self.peers:
                    try:
                        await self._push(peer, key)
                        break
                    except GrabenError as exc:
                        log.warning("could not copy %s to %s: %s", _named(key), peer, exc.message)
            finally:
                self._sending.discard(key)

    async def _push(self, peer: str, key: SegmentKey) -> None:
        held = self.segments.find(key)
        if held is None or held.peer:
            return  # dropped meanwhile, or a copy already
        path = self.segments.path(key, False, True)
        conn = await self._conn(peer)
        fd = os.open(path, _READ)
        try:
            for offset in range(0, max(held.size, 1), PIECE):
                data = await asyncio.to_thread(os.pread, fd, PIECE, offset)
                if len(data) != min(PIECE, held.size - offset):
                    raise NotFound(f"segment {_named(key)} was dropped while being copied")
                last = offset + len(data) == held.size
                sums = self.segments.sums.get((key, False), []) if last else []
                body = encode(Piece(key, held.size, offset, len(data), sums))
                await conn.call("agent.put", body, payload=memoryview(data), token=self._token)
        finally:
            os.close(fd)
        self._count("pushed_bytes", "Bytes of segments copied to peers", held.size)

    async def _pull(self, key: SegmentKey) -> Held:
        """Copy ``key``'s segment from the first peer holding it; ``NotFound`` if none does."""
        which = JobRank(key.job, key.rank, key.world)
        for peer in self.peers:
            try:
                if key.step not in await self._ask(peer, "agent.has", which, list[int]):
                    continue
                return await self._pull_from(peer, key)
            except GrabenError as exc:
                log.warning("could not fetch %s from peer %s: %s", _named(key), peer, exc.message)
        raise NotFound(f"no complete segment {_named(key)} here or at a peer")

    async def _pull_from(self, peer: str, key: SegmentKey) -> Held:
        located: Located = await self._ask(peer, "agent.locate", key, Located)
        size = located.size
        path = await self._make_room(key, size, False)
        conn = await self._conn(peer)
        buffer = bytearray(min(PIECE, size))
        for offset in range(0, size, PIECE):
            n = min(PIECE, size - offset)
            body = encode(Piece(key, size, offset, n))
            into = memoryview(buffer)[:n]
            await conn.call("agent.get", body, into=into, token=self._token)
            await asyncio.to_thread(_write_at, path, into, offset)
        held = self.segments.complete(key, False)
        assert held is not None
        await self._check_copy(held, located.sums)
        self._count("pulled_bytes", "Bytes of segments fetched from peers", size)
        return held

    async def _ask(self, peer: str, op: str, body: object, kind: Any) -> Any:
        try:
            async with asyncio.timeout(PEER_TIMEOUT_S):
                conn = await self._conn(peer)
                reply, _ = await conn.call(op, encode(body), token=self._token)
        except TimeoutError:
            raise Timeout(f"peer {peer} did not answer {op} within {PEER_TIMEOUT_S} s") from None
        return decode(reply, kind)

    async def _conn(self, peer: str) -> Connection:
        conn = self._conns.get(peer)
        if conn is None or conn.closed:
            host, _, port = peer.rpartition(":")
            conn = self._conns[peer] = await Connection.open(
                host, int(port), timeout=PEER_TIMEOUT_S
            )
        return conn

    @property
    def _token(self) -> str:
        return auth.client_token(self._secret)

    def _serve_metrics(self) -> None:
        if self.metrics is None or self._metrics_at is None:
            return
        metrics = self.metrics
        for name, doc, value in (
            ("graben_agent_held_bytes", "Bytes of segments held", lambda: self.segments.used),
            ("graben_agent_limit_bytes", "The agent's memory limit", lambda: self.limit),
            ("graben_agent_segments", "Segments held", lambda: len(self.segments.held)),
        ):
            metrics.gauge(name, doc).set_function(value)
        serve_if_asked(metrics, self._metrics_at)

    def _count(self, name: str, doc: str, n: int = 1) -> None:
        if self.metrics is None:
            return
        if name not in self._counts:
            self._counts[name] = self.metrics.counter(f"graben_agent_{name}", doc)
        self._counts[name].inc(n)


_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


def _named(key: SegmentKey) -> str:
    return f"step {key.step} rank {key.rank}/{key.world} of {key.job}"


def _job_of(body: object) -> str:
    """The job a rank's call names (its body: a job's name, or a value naming one)."""
    if isinstance(body, str):
        return body
    key = getattr(body, "key", body)
    job: str = getattr(key, "job", "")
    return job


def _write_at(path: Path, data: memoryview, offset: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        while data.nbytes:
            written = os.pwrite(fd, data, offset)
            data, offset = data[written:], offset + written
    finally:
        os.close(fd)
