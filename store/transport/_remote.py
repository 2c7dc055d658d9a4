"""The cluster's side of the transport seam: metadata and chunks over the wire.

``RemoteMeta`` sends each ``Request`` to a metadata service as op ``meta``:
to the current one of the cluster's endpoints (``_endpoints``), moving to
the next when it stops answering. Mutations carry an idempotency key, so a
repeat after a lost reply is applied once.
``RemoteChunks`` keeps one multiplexed connection per data node (addresses
from the metadata service's node list), sends chunk payloads from the
caller's memory and receives reads straight into the reader's buffer, then
checks that the bytes hash to the chunk's id (blake3; ``check="crc32c"``
checks only the transfer): a copy rewritten on a node's disk, crc32c and all,
is refused like a damaged one, and the reader reads another.

Auth: every call to the metadata service carries the client's token; every
chunk call carries a capability for that chunk and op. ``Grants`` holds the
capabilities that come with placements and layouts, and asks for fresh ones
(``Grant``) when one is missing or about to expire.

Over 500 lines: the metadata side's retries (which failures, how long, what
they log) sit beside the pooling and grants they depend on; splitting
``RemoteMeta`` from ``RemoteChunks`` into two modules is the next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TypeVar

import blake3
import msgspec

from .._batcher import Batcher, Batchers
from .._buffers import in_thread
from .._config import page_entries
from .._errors import (
    GrabenError,
    IntegrityError,
    PermissionDenied,
    QuotaExceeded,
    Timeout,
    Unavailable,
)
from .._hashing import crc32c
from .._types import Capability, ChunkRef, FileInfo, FileLayout, NodeState, Op, Receipt
from ..wire import (
    CLIENT_IDLE_S,
    CONNECT_TIMEOUT,
    DEFAULT_TIMEOUT,
    Connection,
    decode,
    encode,
    from_wire,
)
from ._chunk_calls import ChunkCall, NodeClean, NodeQuery, NodeVouch, Written
from ._endpoints import ANSWER_WITHIN_S, Endpoints, Retry, watched
from ._replies import ChunkPage, Placement
from ._requests import (
    RETRY_WITHIN_S,
    Commit,
    CommitEach,
    Grant,
    ListNodes,
    Prepare,
    Repeat,
    Request,
    with_key,
)

R = TypeVar("R")
log = logging.getLogger("graben.client")
CALL_TIMEOUT = DEFAULT_TIMEOUT
"""Longest one metadata call waits for its reply, whatever the retry deadline."""

RETRY_FOR_S = 30.0
"""How long requests keep retrying while the metadata service is away."""
FIRST_CONTACT_S = 1.0
"""How long a client that has never reached a service keeps trying to."""
NodeLister = Callable[[], Awaitable[list[NodeState]]]
GrantFetcher = Callable[[tuple[str, ...], Op], Awaitable[list[Capability]]]
REFRESH_BEFORE_S = 60.0
"""Ask for a fresh capability when the one at hand expires sooner than this."""
SMALL_WRITE_MAX = 64 * 1024
"""Chunks up to this size that go to one node at once share a call (``chunk.write_many``)."""
SMALL_GROUP_BYTES = 4 << 20
"""Most bytes in one such call."""
KEEP_GRANTS = 65536
"""Capabilities kept at most (a few hundred bytes each), the least recently added dropped."""
GRANT_GROUP = 256
"""Most chunks in one ``Grant`` call (a reply of ~50 KiB, far under the wire's header limit)."""


def open_cluster(
    endpoints: Sequence[tuple[str, int]],
    check_threads: int,
    *,
    token: str,
    read_ahead: int = 0,
    timeout: float = RETRY_FOR_S,
    wait: float = FIRST_CONTACT_S,
    check: str = "blake3",
    tls: ssl.SSLContext | None = None,
) -> tuple[RemoteMeta, RemoteChunks]:
    """Transports to the cluster whose metadata services listen at ``endpoints``
    (``(host, port)`` each; a name stands for all its addresses), over TLS with the
    client context ``tls`` (to the services and the data nodes)."""
    meta = RemoteMeta(endpoints, token, timeout=timeout, wait=wait, tls=tls)
    checker = ThreadPoolExecutor(check_threads, thread_name_prefix="graben-check")
    nodes = RemoteChunks(
        lambda: meta.request(ListNodes()),
        checker,
        meta.grants,
        token=token,
        owns_checker=True,
        read_ahead=read_ahead,
        timeout=timeout,
        check=check,
        tls=tls,
    )
    return meta, nodes


class Grants:
    """Capabilities at hand, by (chunk, op); more fetched when one is missing or stale.

    Concurrent fetches share one ``Grant`` call (collection deletes a page of
    chunks at once: one round trip for the page, not one per chunk).
    """

    def __init__(self, fetch: GrantFetcher) -> None:
        self._fetch = fetch
        self._held: OrderedDict[tuple[str, str], tuple[Capability, float]] = OrderedDict()
        """Each capability, with when to ask for a fresh one: ``REFRESH_BEFORE_S`` before
        it expires, or half way through its life if that is sooner (a tenant's last
        seconds, not minutes)."""
        self._fetching: Batchers[Op, str, Capability | None] = Batchers(
            lambda op: Batcher(partial(self._fetch_group, op), max_size=GRANT_GROUP)
        )

    def add(self, caps: Iterable[Capability]) -> None:
        """Keep capabilities that came with a metadata reply."""
        now = time.time()
        for cap in caps:
            key = (cap.chunk, cap.op)
            self._held[key] = (cap, cap.expires - min(REFRESH_BEFORE_S, (cap.expires - now) / 2))
            self._held.move_to_end(key)
        while len(self._held) > KEEP_GRANTS:
            self._held.popitem(last=False)

    def _fresh(self, chunk: str, op: Op) -> Capability | None:
        """The capability held for ``op`` on ``chunk``, unless it is due for renewal."""
        cap, renew = self._held.get((chunk, op), (None, 0.0))
        return cap if time.time() < renew else None

    async def get(self, chunk: str, op: Op) -> Capability:
        """A capability for ``op`` on ``chunk`` valid for a while yet."""
        cap = self._fresh(chunk, op)
        if cap is None:
            cap = await self._fetching[op].submit(chunk)
            if cap is None:
                raise PermissionDenied(f"the metadata service granted no {op} of chunk {chunk}")
        return cap

    async def _fetch_group(self, op: Op, chunks: list[str]) -> list[Capability | Exception | None]:
        """One ``Grant`` for the group; if it is refused, each chunk's own answer."""
        try:
            caps = await self._fetch(tuple(dict.fromkeys(chunks)), op)
        except PermissionDenied:
            if len(set(chunks)) == 1:
                raise
            return [await self._fetch_one(chunk, op) for chunk in chunks]
        self.add(caps)
        return [self._fresh(chunk, op) for chunk in chunks]

    async def _fetch_one(self, chunk: str, op: Op) -> Capability | Exception | None:
        try:
            self.add(await self._fetch((chunk,), op))
        except PermissionDenied as exc:
            return exc
        return self._fresh(chunk, op)


class Pool:
    """One lazily opened, re-opened-on-loss connection per address (over TLS with
    the client context ``tls``)."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self._connections: dict[str, Connection] = {}
        # One lock per address: a connect hanging on a dead host holds up no other.
        self._locks: dict[str, asyncio.Lock] = {}
        self._tls = tls

    async def get(self, address: str, *, timeout: float = CONNECT_TIMEOUT) -> Connection:
        conn = self._connections.get(address)
        if conn is not None and _usable(conn):
            return conn
        async with self._locks.setdefault(address, asyncio.Lock()):
            conn = self._connections.get(address)
            if conn is None or not _usable(conn):
                if conn is not None:
                    await conn.close()
                host, _, port = address.rpartition(":")
                conn = await Connection.open(host, int(port), timeout=timeout, tls=self._tls)
                self._connections[address] = conn
            return conn

    async def close(self) -> None:
        for conn in self._connections.values():
            await conn.close()
        self._connections.clear()


class _PieceHash:
    """blake3 of a payload fed a piece at a time as it lands, on a thread of its own
    (the GIL released), so that the hash of a chunk is done soon after its last byte."""

    STEP = 1 << 20
    """Bytes landed before a piece goes to the hashing thread."""

    def __init__(self, view: memoryview, thread: ThreadPoolExecutor) -> None:
        self._view, self._thread = view, thread
        self._hasher = blake3.blake3()
        self._fed = 0

    def landed(self, filled: int) -> None:
        if filled - self._fed >= self.STEP:
            self._feed(filled)

    def _feed(self, upto: int) -> None:
        self._thread.submit(self._hasher.update, self._view[self._fed : upto])
        self._fed = upto

    async def digest(self) -> str:
        """The hex blake3 of the whole view (every byte has landed)."""
        if self._fed < self._view.nbytes:
            self._feed(self._view.nbytes)
        done = await asyncio.wrap_future(self._thread.submit(self._hasher.hexdigest))
        return str(done)


def _usable(conn: Connection) -> bool:
    """Open, and not idle so long that its server may be about to drop it: a
    mutation sent just as a server closes would be lost without a trace."""
    return not conn.closed and conn.idle_s < CLIENT_IDLE_S


class RemoteMeta:
    """``MetaTransport`` to a cluster's metadata services (one at a time)."""

    def __init__(
        self,
        endpoints: Sequence[tuple[str, int]],
        token: str,
        *,
        timeout: float = RETRY_FOR_S,
        wait: float = FIRST_CONTACT_S,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.endpoints = Endpoints(endpoints)
        """The services' addresses, and the one in use."""
        self.timeout = timeout
        """Seconds a request keeps retrying transport failures."""
        self.wait = wait
        """Seconds a request keeps trying to connect while no service was ever reached."""
        self._reached = False
        self._pool = Pool(tls)
        self._token = token
        self.grants = Grants(lambda chunks, op: self.request(Grant(chunks, op)))
        """Capabilities that came with replies; chunk transports use and refresh them."""
        # Many writers in one process: their placements and commits share round trips.
        self._prepares: Batchers[tuple[int, int], Prepare, list[Placement]] = Batchers(
            lambda _copies: Batcher(
                self._prepare_together, size=lambda p: len(p.chunks), max_size=1024, concurrency=4
            )
        )
        self._commits: Batcher[Commit, list[FileInfo]] = Batcher(
            self._commit_each, size=lambda c: len(c.files), max_size=1024, concurrency=2
        )

    @property
    def address(self) -> str:
        """The metadata service in use."""
        return self.endpoints.using

    @property
    def local_read(self) -> None:
        return None  # every request crosses the network

    async def request(self, request: Request[R]) -> R:
        """Send one request; concurrent placements and commits go together.

        Merged commits stay independent: each batch is committed or fails on
        its own, as if it had been sent alone, under its own idempotency key.
        """
        result: object
        if isinstance(request, Prepare) and not request.avoid:
            copies = (request.replication, request.min_replicas)
            result = await self._prepares[copies].submit(request)
        elif isinstance(request, Commit):
            result = await self._commits.submit(with_key(request))
        else:
            return await self._send(request)
        return result  # type: ignore[return-value]

    async def _prepare_together(self, requests: list[Prepare]) -> list[list[Placement] | Exception]:
        if len(requests) == 1:
            alone: list[Placement] = await self._send(requests[0])
            return [alone]
        chunks = tuple(c for r in requests for c in r.chunks)
        first = requests[0]
        paths = tuple(p for r in requests for p in r.paths)
        sent = tuple(n for r in requests for n in r.sent)
        if len(paths) != len(chunks):  # a writer that named no files: none checked early
            paths = sent = ()
        try:
            merged: list[Placement] = await self._send(
                Prepare(
                    chunks,
                    first.replication,
                    min_replicas=first.min_replicas,
                    paths=paths,
                    sent=sent,
                )
            )
        except QuotaExceeded:  # one writer's: each goes alone, to be told its own outcome
            outcomes: list[list[Placement] | BaseException] = await asyncio.gather(
                *(self._send(r) for r in requests), return_exceptions=True
            )
            return [_outcome(o) for o in outcomes]
        placements = iter(merged)
        return [[next(placements) for _ in r.chunks] for r in requests]

    async def _commit_each(self, requests: list[Commit]) -> list[list[FileInfo] | Exception]:
        if len(requests) == 1:
            infos: list[FileInfo] = await self._send(requests[0])
            return [infos]
        each = CommitEach(tuple(r.files for r in requests), tuple(r.key for r in requests))
        outcomes = await self._send(each)
        return [o.infos if o.error is None else from_wire(o.error) for o in outcomes]

    async def _send(self, request: Request[R]) -> R:
        """Send one request; ride out a metadata service that stops answering.

        Transport failures (cannot connect, connection lost, no answer in
        time) are retried until ``timeout`` seconds have passed: at once
        through the next endpoint if there is another (the client stays
        there), else after a pause. A mutation carries an idempotency key,
        the same in every repeat, so a repeat of one that was applied but
        whose reply was lost gets the first outcome and applies nothing;
        mutations are repeated only within ``RETRY_WITHIN_S`` of the first
        try, while the service still holds their key. A server's refusal is
        its answer and goes straight to the caller, never to another
        endpoint; ``Unavailable`` from a service that answers (its engine is
        away) is retried there after a pause.
        """
        request = with_key(request)
        retry = Retry(self._limit(request))
        while True:
            address: str | None = None
            try:
                address = await self.endpoints.current()
                body = await self._call(address, encode(request), retry)
            except (Unavailable, Timeout) as exc:
                await self._after(request, retry, address, exc)
                continue
            self.endpoints.answered(address)
            result: R = decode(body, request.response)
            self._keep_grants(request, result)
            return result

    def _limit(self, request: Request[R]) -> float:
        """How long ``request`` may be retried; 0: not at all."""
        if request.rule.repeat is Repeat.KEYED:
            return min(self.timeout, RETRY_WITHIN_S)
        return self.timeout

    async def _call(self, address: str, body: msgspec.Raw, retry: Retry) -> msgspec.Raw:
        """One try at ``address``; notes in ``retry`` whether a failure was the service's
        own answer."""
        retry.answered = False
        several = self.endpoints.several
        wait = min(max(retry.left(), 0.1), CALL_TIMEOUT)
        connect = min(ANSWER_WITHIN_S if several else CONNECT_TIMEOUT, wait)
        if not self._reached:  # a dead endpoint costs the first contact's wait, no more
            connect = min(connect, max(self.wait - (time.monotonic() - retry.start), 0.1))
        conn = await self._pool.get(address, timeout=connect)
        self._reached = True
        try:
            return await watched(conn, body, self._token, wait, ping=several)
        except Unavailable:
            retry.answered = not conn.closed  # a reply, not a lost connection
            raise

    async def _after(
        self, request: Request[R], retry: Retry, address: str | None, exc: GrabenError
    ) -> None:
        """After a failed try: raise if it is over; else move to the next endpoint at once,
        or, once every endpoint failed this round, pause."""
        retry.tries += 1
        if retry.limit <= 0:
            raise exc
        if not self._reached and time.monotonic() - retry.start >= self.wait:
            raise Unavailable(
                f"cannot reach the metadata service: {exc.message} (to wait for a cluster "
                "that is starting: --wait SECONDS, or connect(url, wait=SECONDS))",
                exc.path,
            ) from None
        left = retry.left()
        if left <= 0:
            raise type(exc)(
                f"gave up on {type(request).__name__} after retrying for "
                f"{time.monotonic() - retry.start:.1f} s ({retry.tries} tries; timeout "
                f"{retry.limit:g} s): {exc.message}",
                exc.path,
            ) from None
        if address is not None and not retry.answered:
            retry.tried.add(address)
            if self.endpoints.move(address, exc.message) not in retry.tried:
                return
        if not retry.warned and self._reached:  # else a first contact: its error says it all
            retry.warned = True
            log.warning(
                "metadata service at %s: %s; retrying %s until %s (timeout %g s)",
                address or self.endpoints,
                exc.message,
                type(request).__name__,
                time.strftime("%H:%M:%S", time.localtime(time.time() + left)),
                retry.limit,
            )
        await retry.pause()
        with contextlib.suppress(Unavailable):
            await self.endpoints.refresh()  # the names may point elsewhere by now

    def _keep_grants(self, request: Request[R], result: R) -> None:
        if isinstance(request, Prepare):
            placements: list[Placement] = result  # type: ignore[assignment]
            self.grants.add(p.grant for p in placements if p.grant is not None)
        elif isinstance(result, FileLayout | ChunkPage):
            self.grants.add(result.grants.values())

    async def close(self) -> None:
        await self._pool.close()


class RemoteChunks:
    """``ChunkTransport`` to the cluster's data nodes."""

    def __init__(
        self,
        list_nodes: NodeLister,
        checker: ThreadPoolExecutor,
        grants: Grants,
        *,
        token: str,
        owns_checker: bool = False,
        read_ahead: int = 0,
        timeout: float = CALL_TIMEOUT,
        check: str = "blake3",
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self._window = read_ahead
        self._blake3 = check == "blake3"
        # Hashes pieces of reads as they land, in order (one thread: a hash's
        # updates must not overlap): the check overlaps the receive.
        self._hashing = ThreadPoolExecutor(1, thread_name_prefix="graben-read-hash")
        self._timeout = min(timeout, CALL_TIMEOUT)  # a call to a node waits this at most
        self._grants, self._token = grants, token
        self._small_writes: Batchers[str, tuple[ChunkCall, memoryview], Receipt | None] = Batchers(
            lambda node: Batcher(
                partial(self._write_many, node),
                size=lambda item: item[0].chunk.length,
                max_size=SMALL_GROUP_BYTES,
                concurrency=2,
            )
        )
        self._list_nodes, self._checker, self._owns_checker = list_nodes, checker, owns_checker
        self._nodes: dict[str, NodeState] = {}
        self._pool = Pool(tls)
        # Read-ahead: chunk id -> a fetch into a buffer of ours, at most the window.
        self._ahead: OrderedDict[str, asyncio.Task[bytearray]] = OrderedDict()
        self._spare: list[bytearray] = []  # touched buffers: fresh memory faults at ~1.5 GB/s

    @property
    def prefetch_window(self) -> int:
        return self._window

    @property
    def local_read(self) -> Callable[[str, ChunkRef, memoryview], None] | None:
        return None

    async def nodes(self) -> tuple[str, ...]:
        await self._refresh()
        return tuple(self._nodes)

    async def _refresh(self) -> None:
        self._nodes = {n.id: n for n in await self._list_nodes()}

    async def _address(self, node: str) -> str:
        if node not in self._nodes:
            await self._refresh()
        state = self._nodes.get(node)
        if state is None:
            raise Unavailable(f"the metadata service knows no data node {node!r}")
        return state.address

    async def _conn(self, node: str) -> Connection:
        # A hung node's kernel still accepts: its hello is waited for the client's
        # timeout at most, as any call to it is.
        connect = min(self._timeout, CONNECT_TIMEOUT)
        return await self._pool.get(await self._address(node), timeout=connect)

    async def write(self, node: str, chunk: ChunkRef, data: memoryview) -> Receipt | None:
        cap = await self._grants.get(chunk.id, "write")
        if chunk.length <= SMALL_WRITE_MAX:
            return await self._small_writes[node].submit((ChunkCall(chunk, cap), data))
        conn = await self._conn(node)
        reply, _ = await conn.call(
            "chunk.write", encode(ChunkCall(chunk, cap)), payload=data, timeout=self._timeout
        )
        receipts = decode(reply, list[Receipt])
        return receipts[0] if receipts else None

    async def write_chain(
        self, nodes: Sequence[str], chunk: ChunkRef, data: memoryview
    ) -> list[Receipt]:
        """Chain replication (measured against fan-out by ``graben bench``; fan-out
        is what writers use): the first node passes the chunk down the chain.
        Returns every node's receipt once every node has it durably; fails if any
        did not."""
        cap = await self._grants.get(chunk.id, "write")
        forward = tuple([await self._address(n) for n in nodes[1:]])
        conn = await self._conn(nodes[0])
        body = encode(ChunkCall(chunk, cap, forward))
        reply, _ = await conn.call("chunk.write", body, payload=data, timeout=self._timeout)
        receipts: list[Receipt] = decode(reply, list[Receipt])
        return receipts

    async def _write_many(
        self, node: str, items: list[tuple[ChunkCall, memoryview]]
    ) -> list[GrabenError | Receipt | None]:
        """Small chunks bound for one node in one call: one copy of a few KiB each
        buys one round trip and one disk sync for the lot."""
        # Joined before any wait: a caller that gave up may reuse its buffer after.
        payload = b"".join(data for _, data in items)
        body = encode([call for call, _ in items])
        conn = await self._conn(node)
        reply, _ = await conn.call(
            "chunk.write_many", body, payload=memoryview(payload), timeout=self._timeout
        )
        outcomes = decode(reply, list[Written])
        return [w.receipt if w.error is None else from_wire(w.error) for w in outcomes]

    async def read(self, node: str, chunk: ChunkRef, into: memoryview) -> None:
        fetched = self._ahead.pop(chunk.id, None)
        if fetched is not None:
            try:
                buffer = await fetched
            except GrabenError:
                pass  # read it again below, from the node asked for
            else:
                into[: chunk.length] = memoryview(buffer)[: chunk.length]  # verified on arrival
                self._recycle(buffer)
                return
        await self._read(node, chunk, into)

    async def _read(self, node: str, chunk: ChunkRef, into: memoryview) -> None:
        conn = await self._conn(node)
        cap = await self._grants.get(chunk.id, "read")
        view = into[: chunk.length]
        body = encode(ChunkCall(chunk, cap))
        hashing = _PieceHash(view, self._hashing) if self._blake3 else None
        _, got = await conn.call(
            "chunk.read",
            body,
            into=view,
            timeout=self._timeout,
            progress=None if hashing is None else hashing.landed,
        )
        if got != chunk.length:
            raise IntegrityError(
                f"chunk {chunk.id} from {node} came with {got} bytes, not {chunk.length}"
            )
        if hashing is not None:
            if await hashing.digest() != chunk.id:
                raise IntegrityError(
                    f"chunk {chunk.id} from {node} is corrupt: its bytes hash to another id "
                    "(blake3)",
                    self.describe(node, chunk.id),
                )
            return
        actual = await in_thread(self._checker, crc32c, view)
        if actual != chunk.crc32c:
            raise IntegrityError(
                f"chunk {chunk.id} from {node} is corrupt: crc32c {actual:08x}, "
                f"expected {chunk.crc32c:08x}",
                self.describe(node, chunk.id),
            )

    async def prefetch(self, node: str, chunks: Sequence[ChunkRef]) -> int:
        """Start fetching the first chunks not yet at hand, keeping at most the window."""
        for chunk in chunks:
            if chunk.id in self._ahead:
                continue
            if len(self._ahead) >= self._window and not self._evict():
                break
            self._ahead[chunk.id] = asyncio.ensure_future(self._fetch(node, chunk))
        return sum(c.id in self._ahead for c in chunks)

    def _evict(self) -> bool:
        """Drop the oldest finished fetch nobody came for; whether a slot is free."""
        for chunk_id, task in self._ahead.items():
            if task.done():
                del self._ahead[chunk_id]
                if not task.cancelled() and task.exception() is None:
                    self._recycle(task.result())
                return True
        return False

    async def _fetch(self, node: str, chunk: ChunkRef) -> bytearray:
        buffer = next((b for b in self._spare if len(b) >= chunk.length), None)
        if buffer is None:
            buffer = bytearray(chunk.length)
        else:
            self._spare.remove(buffer)
        try:
            await self._read(node, chunk, memoryview(buffer)[: chunk.length])
        except BaseException:
            self._recycle(buffer)
            raise
        return buffer

    def _recycle(self, buffer: bytearray) -> None:
        if len(self._spare) < self._window:
            self._spare.append(buffer)

    async def inventory(self, node: str, store: str, after: str = "") -> list[tuple[str, float]]:
        conn = await self._conn(node)
        query = encode(NodeQuery(store, after, page_entries()))
        body, _ = await conn.call(
            "chunk.inventory", query, token=self._token, timeout=self._timeout
        )
        found: list[tuple[str, float]] = decode(body, list[tuple[str, float]])
        return found

    async def temporaries(
        self, node: str, store: str, after: str = ""
    ) -> list[tuple[str, int, float]]:
        conn = await self._conn(node)
        query = encode(NodeQuery(store, after, page_entries()))
        body, _ = await conn.call(
            "chunk.temporaries", query, token=self._token, timeout=self._timeout
        )
        found: list[tuple[str, int, float]] = decode(body, list[tuple[str, int, float]])
        return found

    async def clean(self, node: str, store: str, older_than: float) -> tuple[int, int]:
        conn = await self._conn(node)
        body, _ = await conn.call(
            "chunk.clean",
            encode(NodeClean(store, older_than)),
            token=self._token,
            timeout=self._timeout,
        )
        done: tuple[int, int] = decode(body, tuple[int, int])
        return done

    async def adoption(self, node: str, store: str, *, vouch: bool = False) -> bool:
        conn = await self._conn(node)
        body = encode(NodeVouch(store, vouch))
        reply, _ = await conn.call("chunk.adoption", body, token=self._token, timeout=self._timeout)
        taken: bool = decode(reply, bool)
        return taken

    async def delete(self, node: str, chunk_id: str, older_than: float) -> bool:
        conn = await self._conn(node)
        cap = await self._grants.get(chunk_id, "delete")
        body, _ = await conn.call(
            "chunk.delete", encode((chunk_id, older_than, cap)), timeout=self._timeout
        )
        gone: bool = decode(body, bool)
        return gone

    def describe(self, node: str, chunk_id: str) -> str:
        state = self._nodes.get(node)
        return f"{node}@{state.address if state else '?'}:{chunk_id}"

    def describe_temporary(self, node: str, name: str) -> str:
        return self.describe(node, f"tmp/{name}")

    async def close(self) -> None:
        for task in self._ahead.values():
            task.cancel()
        await asyncio.gather(*self._ahead.values(), return_exceptions=True)
        self._ahead.clear()
        await self._pool.close()
        self._hashing.shutdown(wait=True)
        if self._owns_checker:
            self._checker.shutdown(wait=True)


def _outcome(outcome: R | BaseException) -> R | Exception:
    """A gathered outcome for a batcher: a result or an error; a cancellation is raised."""
    if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
        raise outcome
    return outcome
