"""The cluster's side of the transport seam: metadata and chunks over the wire.

``RemoteMeta`` sends each ``Request`` to the metadata service as op ``meta``.
``RemoteChunks`` keeps one multiplexed connection per data node (addresses
from the metadata service's node list), sends chunk payloads from the
caller's memory and receives reads straight into the reader's buffer, then
checks the crc32c itself: the data node checked it too, but only the client
knows the bytes arrived intact.

Auth: every call to the metadata service carries the client's token; every
chunk call carries a capability for that chunk and op. ``Grants`` holds the
capabilities that come with placements and layouts, and asks for fresh ones
(``Grant``) when one is missing or about to expire.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from ._errors import GrabenError, IntegrityError, PermissionDenied, Unavailable
from ._hashing import crc32c
from ._rpc import Connection
from ._types import (
    Capability,
    ChunkCall,
    ChunkRef,
    ChunkRefs,
    ChunkUsers,
    FileLayout,
    GetHealth,
    GetLayout,
    Grant,
    Heartbeat,
    ListDir,
    ListNodes,
    NodeState,
    Op,
    Placement,
    Prepare,
    ReportBad,
    Request,
    Stat,
    Usage,
)
from ._wire import decode, encode

R = TypeVar("R")

RETRY_FOR_S = 30.0
"""How long safe requests keep retrying while the metadata service is away."""
RETRYABLE = frozenset(
    {
        Stat,
        ListDir,
        GetLayout,
        Prepare,
        Usage,
        ChunkRefs,
        ChunkUsers,
        ListNodes,
        GetHealth,
        Heartbeat,
        ReportBad,
        Grant,
    }
)
"""Requests that may be repeated: reads, and writes whose repeat changes nothing."""
NodeLister = Callable[[], Awaitable[list[NodeState]]]
GrantFetcher = Callable[[tuple[str, ...], Op], Awaitable[list[Capability]]]
REFRESH_BEFORE_S = 60.0
"""Ask for a fresh capability when the one at hand expires sooner than this."""
KEEP_GRANTS = 65536
"""Capabilities kept at most (a few hundred bytes each), the least recently added dropped."""


def open_cluster(
    host: str, port: int, check_threads: int, *, token: str, read_ahead: int = 0
) -> tuple[RemoteMeta, RemoteChunks]:
    """Transports to the cluster whose metadata service listens on ``host:port``."""
    meta = RemoteMeta(host, port, token)
    checker = ThreadPoolExecutor(check_threads, thread_name_prefix="graben-check")
    nodes = RemoteChunks(
        lambda: meta.request(ListNodes()),
        checker,
        meta.grants,
        token=token,
        owns_checker=True,
        read_ahead=read_ahead,
    )
    return meta, nodes


class Grants:
    """Capabilities at hand, by (chunk, op); more fetched when one is missing or stale."""

    def __init__(self, fetch: GrantFetcher) -> None:
        self._fetch = fetch
        self._held: OrderedDict[tuple[str, str], Capability] = OrderedDict()

    def add(self, caps: Iterable[Capability]) -> None:
        """Keep capabilities that came with a metadata reply."""
        for cap in caps:
            key = (cap.chunk, cap.op)
            self._held[key] = cap
            self._held.move_to_end(key)
        while len(self._held) > KEEP_GRANTS:
            self._held.popitem(last=False)

    async def get(self, chunk: str, op: Op) -> Capability:
        """A capability for ``op`` on ``chunk`` valid for a while yet."""
        cap = self._held.get((chunk, op))
        if cap is None or cap.expires - time.time() < REFRESH_BEFORE_S:
            self.add(await self._fetch((chunk,), op))
            cap = self._held.get((chunk, op))
            if cap is None:
                raise PermissionDenied(f"the metadata service granted no {op} of chunk {chunk}")
        return cap


class _Pool:
    """One lazily opened, re-opened-on-loss connection per address."""

    def __init__(self) -> None:
        self._connections: dict[str, Connection] = {}
        self._lock = asyncio.Lock()

    async def get(self, address: str) -> Connection:
        conn = self._connections.get(address)
        if conn is not None and not conn.closed:
            return conn
        async with self._lock:
            conn = self._connections.get(address)
            if conn is None or conn.closed:
                host, _, port = address.rpartition(":")
                conn = await Connection.open(host, int(port))
                self._connections[address] = conn
            return conn

    async def close(self) -> None:
        for conn in self._connections.values():
            await conn.close()
        self._connections.clear()


class RemoteMeta:
    """``MetaTransport`` to a metadata service."""

    def __init__(self, host: str, port: int, token: str) -> None:
        self.address = f"{host}:{port}"
        self._pool = _Pool()
        self._token = token
        self.grants = Grants(lambda chunks, op: self.request(Grant(chunks, op)))
        """Capabilities that came with replies; chunk transports use and refresh them."""

    async def request(self, request: Request[R]) -> R:
        """Send one request; safe-to-repeat ones ride out a restart of the service.

        A mutation (commit, rename, remove, mkdir) is never repeated: if the
        connection drops, its reply is lost and it may or may not have
        happened (atomically either way), so the caller gets ``Unavailable``.
        """
        deadline = time.monotonic() + RETRY_FOR_S
        delay = 0.05
        while True:
            try:
                conn = await self._pool.get(self.address)
                body, _ = await conn.call("meta", encode(request), token=self._token)
            except Unavailable:
                if type(request) not in RETRYABLE or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            result: R = decode(body, request.response)
            self._keep_grants(request, result)
            return result

    def _keep_grants(self, request: Request[R], result: R) -> None:
        if isinstance(request, Prepare):
            placements: list[Placement] = result  # type: ignore[assignment]
            self.grants.add(p.grant for p in placements if p.grant is not None)
        elif isinstance(result, FileLayout):
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
    ) -> None:
        self._window = read_ahead
        self._grants, self._token = grants, token
        self._list_nodes, self._checker, self._owns_checker = list_nodes, checker, owns_checker
        self._nodes: dict[str, NodeState] = {}
        self._pool = _Pool()
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

    async def _conn(self, node: str) -> Connection:
        if node not in self._nodes:
            await self._refresh()
        state = self._nodes.get(node)
        if state is None:
            raise Unavailable(f"the metadata service knows no data node {node!r}")
        return await self._pool.get(state.address)

    async def write(self, node: str, chunk: ChunkRef, data: memoryview) -> None:
        conn = await self._conn(node)
        cap = await self._grants.get(chunk.id, "write")
        await conn.call("chunk.write", encode(ChunkCall(chunk, cap)), payload=data)

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
        _, got = await conn.call("chunk.read", encode(ChunkCall(chunk, cap)), into=view)
        if got != chunk.length:
            raise IntegrityError(
                f"chunk {chunk.id} from {node} came with {got} bytes, not {chunk.length}"
            )
        loop = asyncio.get_running_loop()
        actual = await loop.run_in_executor(self._checker, crc32c, view)
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

    async def inventory(self, node: str) -> list[tuple[str, float]]:
        conn = await self._conn(node)
        body, _ = await conn.call("chunk.inventory", token=self._token)
        found: list[tuple[str, float]] = decode(body, list[tuple[str, float]])
        return found

    async def delete(self, node: str, chunk_id: str, older_than: float) -> bool:
        conn = await self._conn(node)
        cap = await self._grants.get(chunk_id, "delete")
        body, _ = await conn.call("chunk.delete", encode((chunk_id, older_than, cap)))
        gone: bool = decode(body, bool)
        return gone

    def describe(self, node: str, chunk_id: str) -> str:
        state = self._nodes.get(node)
        return f"{node}@{state.address if state else '?'}:{chunk_id}"

    async def close(self) -> None:
        for task in self._ahead.values():
            task.cancel()
        await asyncio.gather(*self._ahead.values(), return_exceptions=True)
        self._ahead.clear()
        await self._pool.close()
        if self._owns_checker:
            self._checker.shutdown(wait=True)
