"""A data node: the local chunk store served over the wire, heartbeating to the metadata service.

Ops: ``chunk.write`` (payload received into a pooled buffer, crc32c checked,
fsynced before the reply), ``chunk.read`` (read and verified, sent from a
pooled buffer), ``chunk.inventory`` and ``chunk.delete`` (for fsck and
collection). The node's id lives in its data directory, so a restarted node
is the same node.

Reads, writes and deletes need the metadata service's capability for that
chunk and op, checked here with the shared secret alone; an inventory needs
the client token. A refused call reads and writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import mmap
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from . import _auth
from ._buffers import BufferPool
from ._chunkstore import GROUP_SYNC_MAX, LocalChunkStore
from ._config import DEFAULT_CHUNK_SIZE, MAX_CHUNK_SIZE
from ._errors import GrabenError, ProtocolError
from ._group import Batcher
from ._remote import Pool
from ._rpc import (
    DEFAULT_IDLE_TIMEOUT,
    Answer,
    Connection,
    Handler,
    PayloadSink,
    Server,
    every,
    stop,
)
from ._types import (
    Capability,
    ChunkCall,
    ChunkRef,
    Heartbeat,
    NodeState,
    Op,
    ReportBad,
    Request,
    WireError,
)
from ._wire import Call, decode, encode, to_wire

log = logging.getLogger("graben.node")
HEARTBEAT_S = 2.0


def node_id(root: Path) -> str:
    """The node's id, made on first start and kept in its data directory."""
    path = root / "node-id"
    if not path.exists():
        path.write_text(uuid.uuid4().hex + "\n")
    return path.read_text().strip()


class DataNode:
    """Serves one chunk directory."""

    def __init__(
        self,
        root: Path,
        *,
        rack: str,
        meta: tuple[str, int],
        secret: bytes,
        io_threads: int = 4,
        scrub_interval: float = 3600.0,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
    ):
        root.mkdir(parents=True, exist_ok=True)
        self.root, self.rack, self.meta = root, rack, meta
        self.id = node_id(root)
        self._secret = secret
        self._token = _auth.client_token(secret)
        self.store = LocalChunkStore(root / "chunks")
        self.pool = BufferPool(DEFAULT_CHUNK_SIZE, keep=2 * io_threads + 4)
        self._io = ThreadPoolExecutor(io_threads, thread_name_prefix="graben-node")
        self._lent: dict[int, mmap.mmap] = {}
        self.server: Server | None = None
        self.address = ""
        self._beating: asyncio.Task[None] | None = None
        self._scrubbing: asyncio.Task[None] | None = None
        self.scrub_interval = scrub_interval
        self.idle_timeout = idle_timeout
        self._meta_conn: Connection | None = None
        self._peers = Pool()  # other data nodes, for chain replication
        self._small: Batcher[tuple[ChunkRef, memoryview], None] = Batcher(
            partial(self._run, self.store.write_group), max_size=256, concurrency=2
        )

    async def start(self, host: str, port: int) -> Server:
        """Listen, then heartbeat to the metadata service until closed."""
        handlers: dict[str, Handler] = {
            "chunk.write": self._write,
            "chunk.write_many": self._write_many,
            "chunk.read": self._read,
            "chunk.inventory": self._inventory,
            "chunk.delete": self._delete,
        }
        sinks: dict[str, PayloadSink] = {"chunk.write": self._sink, "chunk.write_many": self._sink}
        self.server = await Server.start(
            handlers, host, port, sinks, admit=self._admit, idle_timeout=self.idle_timeout
        )
        self.address = f"{host}:{self.server.port}"
        self._beating = every(HEARTBEAT_S, self._heartbeat, "heartbeat", at_once=True)
        self._scrubbing = every(self.scrub_interval, self.scrub_once, "scrub")
        return self.server

    async def close(self) -> None:
        """Stop heartbeating and serving."""
        await stop(self._beating, self._scrubbing)
        if self.server is not None:
            await self.server.close()
        await self._peers.close()
        self._io.shutdown(wait=True)
        self.store.close()

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._io, partial(fn, *args))

    # -- handlers -------------------------------------------------------------

    def _admit(self, call: Call, length: int) -> None:
        """Before a payload arrives: its capabilities must allow it, and it must be
        exactly the chunk bytes they name (so nobody makes the node hold more)."""
        now = time.time()
        if call.op == "chunk.write":
            request: ChunkCall = decode(call.body, ChunkCall)
            _auth.check(self._secret, request.cap, request.chunk.id, "write", now)
            lengths = [request.chunk.length]
        elif call.op == "chunk.write_many":
            calls = decode(call.body, list[ChunkCall])
            for c in calls:  # signed by the service; each chunk's op is checked as it is stored
                _auth.check(self._secret, c.cap, c.chunk.id, c.cap.op, now)
            lengths = [c.chunk.length for c in calls]
        else:
            _auth.check_token(self._secret, call.token)
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
        _auth.check(self._secret, request.cap, request.chunk.id, op, time.time())
        return request

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
        with self._received(payload) as data:
            request = self._allowed(call, "write")
            if request.forward:
                await self._store_and_forward(request, data)
            else:
                await self._store(request.chunk, data)
        return Answer()

    async def _store(self, chunk: ChunkRef, data: memoryview) -> None:
        if chunk.length <= GROUP_SYNC_MAX:
            await self._small.submit((chunk, data))
        else:
            await self._run(self.store.write, chunk, data)

    async def _store_and_forward(self, request: ChunkCall, data: memoryview) -> None:
        """Chain replication: our copy and the rest of the chain's, at once."""
        nxt, *rest = request.forward
        forwarded = ChunkCall(request.chunk, request.cap, tuple(rest))

        async def forward() -> None:
            conn = await self._peers.get(nxt)
            await conn.call("chunk.write", encode(forwarded), payload=data)

        results = await asyncio.gather(
            self._store(request.chunk, data), forward(), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

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
        return Answer(encode([_wire_error(o) for o in outcomes]))

    async def _store_allowed(self, request: ChunkCall, data: memoryview) -> None:
        _auth.check(self._secret, request.cap, request.chunk.id, "write", time.time())
        await self._store(request.chunk, data)

    async def _read(self, call: Call, payload: memoryview | None) -> Answer:
        chunk = self._allowed(call, "read").chunk
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
            await self._run(self.store.read, chunk, view)
        except BaseException:
            release()
            raise

        return Answer(payload=view, release=release)

    async def _inventory(self, call: Call, payload: memoryview | None) -> Answer:
        _auth.check_token(self._secret, call.token)
        found = await self._run(lambda: list(self.store.inventory()))
        return Answer(encode(found))

    async def _delete(self, call: Call, payload: memoryview | None) -> Answer:
        chunk_id, older_than, cap = decode(call.body, tuple[str, float, Capability])
        _auth.check(self._secret, cap, chunk_id, "delete", time.time())
        return Answer(encode(await self._run(self.store.delete, chunk_id, older_than)))

    # -- heartbeats -------------------------------------------------------------

    async def _tell_meta(self, request: Request[Any]) -> None:
        if self._meta_conn is None or self._meta_conn.closed:
            self._meta_conn = await Connection.open(*self.meta)
        await self._meta_conn.call(
            "meta", encode(request), token=self._token, timeout=HEARTBEAT_S * 2
        )

    async def _heartbeat(self) -> None:
        free, total = await self._run(self.store.capacity)
        await self._tell_meta(Heartbeat(NodeState(self.id, self.address, self.rack, free, total)))

    # -- scrubbing --------------------------------------------------------------

    async def scrub_once(self) -> int:
        """Re-hash every chunk file against its name; report the bad ones. Returns how many."""
        bad = 0
        for chunk_id, _mtime in await self._run(lambda: list(self.store.inventory())):
            if not await self._run(self.store.intact, chunk_id):
                bad += 1
                reason = "scrub: content does not match its name"
                await self._tell_meta(ReportBad(chunk_id, self.id, reason))
        return bad


def _wire_error(outcome: BaseException | None) -> WireError | None:
    """One chunk's outcome in a ``chunk.write_many`` reply."""
    if outcome is None:
        return None
    if isinstance(outcome, GrabenError):
        return to_wire(outcome)
    raise outcome  # not the chunk's fault: the whole call fails
