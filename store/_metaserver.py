"""The metadata service: the namespace logic of ``_namespace.py`` served over the wire.

Stateless beyond its engine (node registry included), so several copies may
serve one engine. One op, ``meta``, carries every ``Request`` of
``_types.py``; the engine's blocking calls run on a small thread pool, so
many clients' requests proceed at once (SQLite serialises the writers).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Union

from ._namespace import Namespace
from ._placement import place
from ._repo import Repository
from ._rpc import Answer, Server
from ._types import ChunkRef, NodeState, request_types
from ._wire import Call, decode, encode

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
        threads: int = 8,
    ) -> None:
        self.namespace = Namespace(
            repo, self._place, default_replication=replication, heartbeat_timeout=heartbeat_timeout
        )
        self._threads = ThreadPoolExecutor(threads, thread_name_prefix="graben-meta")
        self._nodes: tuple[float, list[NodeState]] = (0.0, [])
        self.server: Server | None = None

    async def start(self, host: str, port: int) -> Server:
        """Listen for clients."""
        self.server = await Server.start({"meta": self._meta}, host, port)
        return self.server

    async def close(self) -> None:
        """Stop serving and release the engine."""
        if self.server is not None:
            await self.server.close()
        self._threads.shutdown(wait=True)
        self.namespace.repo.close()

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
