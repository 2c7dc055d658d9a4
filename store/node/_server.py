"""A data node: the local chunk store served over the wire, heartbeating to the metadata service.

Ops: ``chunk.write`` (payload received into a pooled buffer, crc32c and
blake3 checked, fsynced before the reply, which is the node's signed receipt:
the writer's proof, for a tenant's commit, that it held the bytes), ``chunk.read`` (sent from the
chunk file by ``sendfile``, unread by the node: the client checks the crc32c
and reports a bad copy, and the scrubber checks every file; over TLS, read,
verified and sent from a pooled buffer), ``chunk.inventory``, ``chunk.delete``,
``chunk.temporaries`` and ``chunk.clean`` (for fsck and collection; lists
come a page at a time). The node's id lives in its data directory, so a
restarted node is the same node.

The node belongs to one store: it keeps the store's id (``store-id``, next to
``node-id``) from its first heartbeat on, and a metadata service of another
store refuses it (a mistyped ``--engine`` must not adopt, and then collect,
this node's chunks). Calls name the store too: capabilities carry its id,
listings and cleaning ask for it, and another store's are refused.

Reads, writes and deletes need the metadata service's capability for that
chunk and op, checked here with the shared secret alone; listings and
cleaning need the client token. A refused call reads and writes nothing.
A write that would leave less than ``RESERVE`` free on the disk, counting the
writes still landing, is refused with ``NoSpace``.

Heartbeats and reports go through a ``RemoteMeta`` to the cluster's metadata
services (``--meta h1:7100,h2:7100``): to whichever answers, as a client's
requests do, since they all record into the one engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import mmap
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from .._batcher import Batcher
from .._buffers import BufferPool
from .._config import DEFAULT_CHUNK_SIZE, MAX_CHUNK_SIZE, RESERVE, TLS, page_entries
from .._errors import GrabenError, NoSpace, PermissionDenied, ProtocolError
from .._types import Capability, ChunkRef, Op, Receipt
from ..tier import Bucket
from ..transport import (
    ChunkCall,
    NodeClean,
    NodeQuery,
    NodeVouch,
    Pool,
    RemoteMeta,
    ReportBad,
    Written,
)
from ..wire import (
    DEFAULT_IDLE_TIMEOUT,
    Answer,
    Call,
    FileSpan,
    Handler,
    Metrics,
    PayloadSink,
    Server,
    auth,
    decode,
    dialled,
    encode,
    every,
    serve_if_asked,
    stop,
    to_wire,
)
from ..wire import (
    tls as wire_tls,
)
from ._chunkstore import DIR_MODE, GROUP_SYNC_MAX, LocalChunkStore, write_private
from ._identity import adoption, read_id, seal_directory
from ._membership import HEARTBEAT_S, Membership
from ._sealed import Sealer
from ._tier import Tier

log = logging.getLogger("graben.node")
SENDFILE_MIN = 256 << 10
"""Chunks this large or larger are sent by ``sendfile``; smaller ones from memory."""


def node_id(root: Path) -> str:
    """The node's id, made on first start and kept in its data directory."""
    path = root / "node-id"
    if read_id(path) is None:
        write_private(path, uuid.uuid4().hex + "\n")
    found = read_id(path)
    assert found is not None
    return found


class DataNode:
    """Serves one chunk directory."""

    def __init__(
        self,
        root: Path,
        *,
        rack: str,
        meta: Sequence[tuple[str, int]],
        secret: bytes,
        io_threads: int = 4,
        scrub_interval: float = 3600.0,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        metrics: tuple[str, int] | None = None,
        tls: TLS | None = None,
        tier: str | None = None,
        tier_cache: int = 10 << 30,
        sealer: Sealer | None = None,
    ):
        """``tls``: serve over TLS only, and dial the metadata service (heartbeats)
        and other nodes (chains) over TLS, showing this node's certificate. ``tier``: the
        cluster's S3 tier (``s3://BUCKET/PREFIX``), read through on a miss into a cache of
        at most ``tier_cache`` bytes. ``sealer``: the store's key, its chunk files encrypted
        at rest (``_sealed.py``; a directory sealed otherwise refuses to start)."""
        self._tls = None if tls is None else wire_tls.server_context(tls)
        self._dial_tls = None if tls is None else wire_tls.client_context(tls)
        root.mkdir(DIR_MODE, parents=True, exist_ok=True)
        self.root, self.rack = root, rack
        self.id = node_id(root)
        self._accepted_unstored = 0
        """Bytes of writes accepted and not yet stored."""
        self._secret = secret
        self._token = auth.client_token(secret)
        self.store = LocalChunkStore(root / "chunks", sealer=sealer)
        seal_directory(root, sealer, self.store)
        self.tier = None
        if tier is not None:
            self.tier = Tier(Bucket(tier), root / "cache", tier_cache, self._run, sealer)
        self.pool = BufferPool(DEFAULT_CHUNK_SIZE, keep=2 * io_threads + 4)
        self._io = ThreadPoolExecutor(io_threads, thread_name_prefix="graben-node")
        self._lent: dict[int, mmap.mmap] = {}
        self.server: Server | None = None
        self.address = ""
        self._beating: asyncio.Task[None] | None = None
        self._scrubbing: asyncio.Task[None] | None = None
        self.scrub_interval = scrub_interval
        self.idle_timeout = idle_timeout
        # Heartbeats and reports go to whichever metadata service answers (any of them
        # records them in the one engine they share).
        self.meta = RemoteMeta(meta, self._token, timeout=HEARTBEAT_S * 2, tls=self._dial_tls)
        self.membership = Membership(self.id, root, rack, self.meta, self.store, self._run)
        self._peers = Pool(self._dial_tls)  # other data nodes, for chain replication
        self._small: Batcher[tuple[ChunkRef, memoryview], None] = Batcher(
            partial(self._run, self.store.write_group), max_size=256, concurrency=2
        )
        self._metrics_at = metrics
        self.metrics = None if metrics is None else Metrics()
        """Served at ``metrics`` (``HOST:PORT``) from ``start`` to ``close``, if given."""
        self._counts = None if self.metrics is None else _ChunkMetrics(self.metrics, self.store)

    async def start(self, host: str, port: int, *, advertise: str | None = None) -> Server:
        """Listen, then heartbeat to the metadata service until closed.

        ``advertise`` (``HOST:PORT``, or ``HOST`` with the bound port) is the address
        the heartbeats carry, so the one clients dial: needed when ``host`` is a
        wildcard or sits behind a NAT."""
        handlers: dict[str, Handler] = {
            "chunk.write": self._write,
            "chunk.write_many": self._write_many,
            "chunk.read": self._read,
            "chunk.inventory": self._inventory,
            "chunk.delete": self._delete,
            "chunk.temporaries": self._temporaries,
            "chunk.clean": self._clean,
            "chunk.adoption": self._adoption,
        }
        sinks: dict[str, PayloadSink] = {"chunk.write": self._sink, "chunk.write_many": self._sink}
        self.serve_metrics()
        self.server = await Server.start(
            handlers,
            host,
            port,
            sinks,
            admit=self._admit,
            idle_timeout=self.idle_timeout,
            metrics=self.metrics,
            tls=self._tls,
        )
        told = advertise or host
        self.address = told if ":" in told else f"{told}:{self.server.port}"
        self.membership.address = self.address
        try:
            where = self.serve_metrics(self.server.port)
        except BaseException:
            await self.server.close()
            raise
        self.membership.metrics = dialled(where, self.address) if where else ""
        try:
            await self.membership.beat(first=True)
        except PermissionDenied:  # not the store's encryption: refuse to start
            await self.close()
            raise
        except GrabenError as exc:  # no service answers yet: writes wait for one
            log.warning("the first heartbeat failed: %s; writes wait until one answers", exc)
        self._beating = every(HEARTBEAT_S, self.membership.beat, "heartbeat")
        self._scrubbing = every(self.scrub_interval, self.scrub_once, "scrub")
        return self.server

    def serve_metrics(self, port: int | None = None) -> str:
        """Serve ``/metrics``, if asked and not yet; where (``start`` does, ``port`` its
        own once bound; a caller trying port after port for the node calls it first, so a
        metrics port taken fails only once)."""
        return serve_if_asked(self.metrics, self._metrics_at, port)

    async def close(self) -> None:
        """Stop heartbeating and serving."""
        await stop(self._beating, self._scrubbing)
        await self.meta.close()
        if self.server is not None:
            await self.server.close()
        await self._peers.close()
        if self.metrics is not None:
            self.metrics.close()
        self._io.shutdown(wait=True)
        self.store.close()
        if self.tier is not None:
            self.tier.close()

    @property
    def store_id(self) -> str | None:
        """The store this node belongs to; ``None`` until its first heartbeat is answered."""
        return self.membership.store_id

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._io, partial(fn, *args))

    # -- handlers -------------------------------------------------------------

    def _admit(self, call: Call, length: int) -> None:
        """Before a payload arrives: its capabilities must allow it, and it must be
        exactly the chunk bytes they name (so nobody makes the node hold more)."""
        if call.op == "chunk.write":
            request: ChunkCall = decode(call.body, ChunkCall)
            self._check(request.cap, request.chunk.id, "write")
            lengths = [request.chunk.length]
        elif call.op == "chunk.write_many":
            calls = decode(call.body, list[ChunkCall])
            for c in calls:  # signed by the service; each chunk's op is checked as it is stored
                self._check(c.cap, c.chunk.id, c.cap.op)
            lengths = [c.chunk.length for c in calls]
        else:
            auth.check_token(self._secret, call.token)
            return
        if sum(lengths) != length or any(n > MAX_CHUNK_SIZE for n in lengths):
            raise ProtocolError(f"{call.op}: a payload of {length} bytes for chunks of {lengths}")

    def _sink(self, call: Call, length: int) -> memoryview:
        buffer = self.pool.get(length)
        view = memoryview(buffer)[:length]
        self._lent[id(view)] = buffer
        return view

    def _allowed(self, call: Call, op: Op) -> ChunkCall:
        """The call's chunk and what goes with it, if its capability allows the op."""
        request: ChunkCall = decode(call.body, ChunkCall)
        self._check(request.cap, request.chunk.id, op)
        return request

    def _check(self, cap: Capability, chunk: str, op: Op) -> None:
        """``PermissionDenied`` unless ``cap`` allows ``op`` on ``chunk`` in this node's store."""
        auth.check(self._secret, cap, chunk, op, time.time(), store=self.store_id)

    def _check_store(self, call: Call, store: str) -> None:
        """A listing or cleaning needs the client token, for this node's store."""
        auth.check_token(self._secret, call.token)
        if self.store_id is not None and store != self.store_id:
            raise PermissionDenied(
                f"data node {self.id} belongs to store {self.store_id}, not to store {store}"
            )

    @contextlib.contextmanager
    def _received(self, payload: memoryview | None) -> Iterator[memoryview]:
        """A call's payload, landed in a pooled buffer that goes back after the block."""
        buffer = self._lent.pop(id(payload), None)
        data = payload if payload is not None else memoryview(b"")
        try:
            yield data
        finally:
            data.release()
            if buffer is not None:
                self.pool.put(buffer)

    async def _write(self, call: Call, payload: memoryview | None) -> Answer:
        """Store the chunk (and pass it down a chain); the reply is every node's receipt."""
        with self._received(payload) as data:
            request = self._allowed(call, "write")
            if request.forward:
                receipts = await self._store_and_forward(request, data)
            else:
                receipts = [await self._store_received(request, data)]
        return Answer(encode(receipts))

    async def _store_received(self, request: ChunkCall, data: memoryview) -> Receipt:
        """Store a chunk; our receipt for it (the bytes were checked against its id),
        stamped before the write: the file's mtime is never earlier (but for the coarse
        clock's tick), which a commit racing collection relies on (``meta/_commits.py``)."""
        started = time.time()
        await self._store(request.chunk, data)
        return auth.receipt(
            self._secret, request.chunk.id, self.id, started, store=request.cap.store
        )

    async def _store(self, chunk: ChunkRef, data: memoryview) -> None:
        await self.membership.admitted()
        with self._reserved(chunk.length):
            if chunk.length <= GROUP_SYNC_MAX:
                await self._small.submit((chunk, data))
            else:
                await self._run(self.store.write, chunk, data)
        if self._counts is not None:
            self._counts.writes.inc()
            self._counts.written.inc(chunk.length)

    @contextlib.contextmanager
    def _reserved(self, length: int) -> Iterator[None]:
        """Count ``length`` bytes as landing for the block, if the disk keeps its reserve.

        Writes in flight count in full although some of their bytes already
        show in the disk's free space: refusing a little early beats
        overshooting the reserve when many land at once.
        """
        free = self.store.capacity()[0] - self._accepted_unstored
        if free - length < RESERVE:
            raise NoSpace(
                f"data node {self.id} at {self.address}: {max(free, 0)} bytes free (writes "
                f"in flight counted); a {length}-byte chunk would leave less than its "
                f"{RESERVE >> 20} MiB reserve; not stored"
            )
        self._accepted_unstored += length
        try:
            yield
        finally:
            self._accepted_unstored -= length

    async def _store_and_forward(self, request: ChunkCall, data: memoryview) -> list[Receipt]:
        """Chain replication: our copy and the rest of the chain's, at once."""
        nxt, *rest = request.forward
        forwarded = ChunkCall(request.chunk, request.cap, tuple(rest))

        async def forward() -> list[Receipt]:
            conn = await self._peers.get(nxt)
            reply, _ = await conn.call("chunk.write", encode(forwarded), payload=data)
            receipts: list[Receipt] = decode(reply, list[Receipt])
            return receipts

        ours, theirs = await asyncio.gather(
            self._store_received(request, data), forward(), return_exceptions=True
        )
        if isinstance(ours, BaseException):
            raise ours
        if isinstance(theirs, BaseException):
            raise theirs
        return [ours, *theirs]

    async def _write_many(self, call: Call, payload: memoryview | None) -> Answer:
        """Small chunks in one payload, each with its own capability; each one's error."""
        with self._received(payload) as data:
            calls = decode(call.body, list[ChunkCall])
            ends = list(itertools.accumulate(c.chunk.length for c in calls))
            if (ends[-1] if ends else 0) != data.nbytes:
                raise ProtocolError("chunk.write_many: lengths do not add up to the payload")
            outcomes = await asyncio.gather(
                *(
                    self._store_allowed(c, data[end - c.chunk.length : end])
                    for c, end in zip(calls, ends, strict=True)
                ),
                return_exceptions=True,
            )
        return Answer(encode([_written(o) for o in outcomes]))

    async def _store_allowed(self, request: ChunkCall, data: memoryview) -> Receipt:
        self._check(request.cap, request.chunk.id, "write")
        return await self._store_received(request, data)

    async def _read(self, call: Call, payload: memoryview | None) -> Answer:
        chunk = self._allowed(call, "read").chunk
        if self._counts is not None:
            self._counts.reads.inc()
            self._counts.read.inc(chunk.length)
        store = self.store
        if self.tier is not None and not store.path(chunk.id).exists():
            store = await self.tier.local(chunk)  # a chunk of the S3 tier: read through
        if self._tls is None and chunk.length >= SENDFILE_MIN and store.sealer is None:
            # open and fstat on the loop: a hop to a thread and back cost 20% of warm
            # reads (1.6 against 2.0 GB/s over loopback); the file's bytes never pass here
            fd = store.open_chunk(chunk)
            return Answer(file=FileSpan(fd, 0, chunk.length), release=partial(os.close, fd))
        assert self.server is not None
        budget = self.server.budget  # replies being read and sent count too
        await budget.hold(chunk.length)
        buffer = self.pool.get(chunk.length)
        view = memoryview(buffer)[: chunk.length]

        def release() -> None:
            view.release()
            self.pool.put(buffer)
            budget.give(chunk.length)

        try:
            await self._run(store.read, chunk, view)
        except BaseException:
            release()
            raise
        return Answer(payload=view, release=release)

    async def _inventory(self, call: Call, payload: memoryview | None) -> Answer:
        query = decode(call.body, NodeQuery)
        self._check_store(call, query.store)
        found = await self._run(self.store.inventory, query.after, page_entries(query.limit))
        return Answer(encode(found))

    async def _temporaries(self, call: Call, payload: memoryview | None) -> Answer:
        query = decode(call.body, NodeQuery)
        self._check_store(call, query.store)
        found = await self._run(self.store.temporaries, query.after, page_entries(query.limit))
        return Answer(encode(found))

    async def _adoption(self, call: Call, payload: memoryview | None) -> Answer:
        request = decode(call.body, NodeVouch)
        self._check_store(call, request.store)
        taken = await self._run(partial(adoption, self.root, vouch=request.vouch))
        return Answer(encode(taken))

    async def _clean(self, call: Call, payload: memoryview | None) -> Answer:
        request = decode(call.body, NodeClean)
        self._check_store(call, request.store)
        return Answer(encode(await self._run(self.store.clean_temporaries, request.older_than)))

    async def _delete(self, call: Call, payload: memoryview | None) -> Answer:
        chunk_id, older_than, cap = decode(call.body, tuple[str, float, Capability])
        self._check(cap, chunk_id, "delete")
        return Answer(encode(await self._run(self.store.delete, chunk_id, older_than)))

    # -- heartbeats -------------------------------------------------------------

    # -- scrubbing --------------------------------------------------------------

    async def scrub_once(self) -> int:
        """Re-hash every chunk file against its name; report the bad ones, and when the
        pass ended (in the heartbeats). Returns how many."""
        bad, after = 0, ""
        while page := await self._run(self.store.inventory, after, page_entries()):
            for chunk_id, _mtime in page:
                if not await self._run(self.store.intact, chunk_id):
                    bad += 1
                    reason = "scrub: content does not match its name"
                    await self.membership.request(ReportBad(chunk_id, self.id, reason))
            after = page[-1][0]
        self.membership.scrubbed = time.time()
        return bad


class _ChunkMetrics:
    """A node's own metrics, beside the requests' (free bytes read at each scrape)."""

    def __init__(self, metrics: Metrics, store: LocalChunkStore) -> None:
        self.writes = metrics.counter("graben_chunk_writes", "Chunks stored on this node")
        self.written = metrics.counter("graben_chunk_write_bytes", "Bytes of chunks stored")
        self.reads = metrics.counter("graben_chunk_reads", "Chunks read and verified")
        self.read = metrics.counter("graben_chunk_read_bytes", "Bytes of chunks read")
        free = metrics.gauge("graben_free_bytes", "Bytes free on the disk holding the chunks")
        free.set_function(lambda: store.capacity()[0])
        total = metrics.gauge("graben_total_bytes", "Bytes of the disk holding the chunks")
        total.set_function(lambda: store.capacity()[1])


def _written(outcome: Receipt | BaseException) -> Written:
    """One chunk's outcome in a ``chunk.write_many`` reply."""
    if isinstance(outcome, Receipt):
        return Written(receipt=outcome)
    if isinstance(outcome, GrabenError):
        return Written(error=to_wire(outcome))
    raise outcome  # not the chunk's fault: the whole call fails
