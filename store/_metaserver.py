"""The metadata service: the namespace logic of ``_namespace.py`` served over the wire.

Stateless beyond its engine (node registry included), so several copies may
serve one engine. One op, ``meta``, carries every ``Request`` of
``_types.py``; the engine's blocking calls run on a small thread pool, so
many clients' requests proceed at once (SQLite serialises the writers).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Union

from ._errors import GrabenError, IntegrityError, NotFound
from ._namespace import Namespace
from ._placement import place
from ._remote import RemoteChunks
from ._repo import Repository
from ._rpc import Answer, Server, every, stop
from ._types import ChunkRef, Degraded, NodeState, request_types
from ._wire import Call, decode, encode

log = logging.getLogger("graben.meta")
AnyRequest: Any = Union[request_types()]  # noqa: UP007  (built at run time)
NODES_TTL_S = 1.0
"""How long placement may use a cached list of live nodes."""


class MetaService:
    """Serves a ``Namespace`` on one engine to remote clients and data nodes."""

    def __init__(
        self,
        repo: Repository,
        *,
        replication: int = 3,
        heartbeat_timeout: float = 10.0,
        repair_interval: float = 5.0,
        threads: int = 8,
    ) -> None:
        self.namespace = Namespace(
            repo, self._place, default_replication=replication, heartbeat_timeout=heartbeat_timeout
        )
        self._threads = ThreadPoolExecutor(threads, thread_name_prefix="graben-meta")
        self._nodes: tuple[float, list[NodeState]] = (0.0, [])
        self.server: Server | None = None
        self.repair_interval = repair_interval
        checker = ThreadPoolExecutor(2, thread_name_prefix="graben-repair")
        self.chunks = RemoteChunks(self._list_nodes, checker, owns_checker=True)
        self._repairing: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int) -> Server:
        """Listen for clients; repair in the background."""
        self.server = await Server.start({"meta": self._meta}, host, port)
        self._repairing = every(self.repair_interval, self.repair_once, "repair")
        return self.server

    async def close(self) -> None:
        """Stop serving and repairing; release the engine."""
        await stop(self._repairing)
        if self.server is not None:
            await self.server.close()
        await self.chunks.close()
        self._threads.shutdown(wait=True)
        self.namespace.repo.close()

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn, *args)

    async def _list_nodes(self) -> list[NodeState]:
        nodes: list[NodeState] = await self._run(self.namespace.nodes)
        return nodes

    # -- repair ----------------------------------------------------------------

    async def repair_once(self) -> int:
        """Delete reported bad copies, then copy short chunks to new nodes; copies made."""
        await self._drop_bad()
        degraded: list[Degraded] = await self._run(self.namespace.degraded)
        if not degraded:
            return 0
        nodes = await self._list_nodes()
        made = 0
        for chunk in degraded:
            made += await self._repair(chunk, nodes)
        return made

    async def _drop_bad(self) -> None:
        bad = self.namespace.bad
        while bad:
            chunk, node, reason = bad.pop(0)
            log.info("deleting bad copy of %s on %s (%s)", chunk, node, reason)
            try:
                await self.chunks.delete(node, chunk, math.inf)
            except GrabenError as exc:
                log.warning("could not delete bad copy of %s on %s: %s", chunk, node, exc)

    async def _repair(self, degraded: Degraded, nodes: list[NodeState]) -> int:
        chunk = degraded.chunk
        if not degraded.live:
            log.error("chunk %s has no live copy left; it cannot be repaired", chunk.id)
            return 0
        try:
            targets = place(
                nodes,
                degraded.want - len(degraded.live),
                chunk.id,
                chunk.length,
                exclude=degraded.live,
            )
        except GrabenError as exc:
            log.warning("cannot repair chunk %s yet: %s", chunk.id, exc)
            return 0
        data = memoryview(bytearray(chunk.length))
        if not await self._read_any(chunk, degraded.live, data):
            return 0
        results = await asyncio.gather(
            *(self.chunks.write(node, chunk, data) for node in targets), return_exceptions=True
        )
        done = tuple(node for node, r in zip(targets, results, strict=True) if r is None)
        if done:
            await self._run(self.namespace.add_replicas, chunk.id, done)
        return len(done)

    async def _read_any(self, chunk: ChunkRef, sources: tuple[str, ...], into: memoryview) -> bool:
        for node in sources:
            try:
                await self.chunks.read(node, chunk, into)
                return True
            except (IntegrityError, NotFound) as exc:
                await self._run(self.namespace.report_bad, chunk.id, node, exc.message)
            except GrabenError as exc:
                log.warning("repair could not read %s from %s: %s", chunk.id, node, exc)
        return False

    async def _meta(self, call: Call, payload: memoryview | None) -> Answer:
        request = decode(call.body, AnyRequest)
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self._threads, self.namespace.execute, request)
        return Answer(encode(result))

    def _place(self, chunk: ChunkRef, replication: int, avoid: tuple[str, ...]) -> tuple[str, ...]:
        # Runs on an engine thread; a list of nodes a second old is good enough.
        stamp, nodes = self._nodes
        if time.monotonic() - stamp > NODES_TTL_S:
            nodes = self.namespace.nodes()
            self._nodes = (time.monotonic(), nodes)
        return place(nodes, replication, chunk.id, chunk.length, exclude=avoid)
