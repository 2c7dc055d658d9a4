"""The leader's collection rounds: space comes back by itself.

A duty beside repair and conversion (``MetaService._duties``), with no command:
each round, only while leading, forgets up to ``per_round`` chunks that no file
has used for ``grace_s`` seconds (one engine transaction under the lease's
fence, ``ChunkRecords.collect``), then deletes their copies and erasure-coded
pieces on the data nodes through the service's own chunk transport.

A copy goes only if its file was last written before its chunk's cutoff (the
moment the chunk lost its last reference): a new upload of the same bytes
rewrites the file (its mtime the clock's, to the nanosecond), so the node keeps
it, and the commit that names it finds it there. A copy written before the
cutoff by a writer that commits only after the chunk was forgotten may be
gone: that commit is told from the chunk's record in ``collected`` and the
node's receipt (stamped before the write), and fails rather than name bytes
that are gone (``meta/_commits.py``). The records are kept a day
(``KEEP_RECORDS_S``, a receipt's life). The services' and the nodes' clocks
are taken to agree (NTP): a copy rewritten just after the cutoff on a node
whose clock runs behind may go, and a commit naming it is then refused.

A copy on a node that cannot be reached is remembered (up to ``RETRY_MOST``,
in this service's memory) and deleted at the first round that finds the node
heartbeating again, so a node that was down gets its space back within a
round of its return; one forgotten (more than that, a new leader) stays an
orphan. So do the chunk files of uploads that never committed (no metadata
names them): those are the orphan sweep's (``_sweep.py``), after its own,
longer grace, or ``fsck --collect``'s.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .._errors import GrabenError, InvalidArgument
from .._types import ChunkRef, NodeState
from ..transport import RemoteChunks
from ..wire import Metrics, auth
from ._chunks import ChunkRecords
from ._repo import Forgotten

log = logging.getLogger("graben.meta")
COLLECT_GRACE_S = 120.0
"""How long a chunk stays unused before the leader collects it, by default: space comes
back within minutes, and a reader still reading a file just removed has that long."""
COLLECT_CHUNKS = 1000
"""Chunks a round collects at most, by default (the rest wait for the next rounds)."""
DELETES_AT_ONCE = 64
"""Copies being deleted at once, across the nodes."""
KEEP_RECORDS_S = auth.RECEIPT_TTL_S
"""How long the record of a collected chunk is kept: as long as a writer's receipt."""
EXPIRE_EVERY_S = 60.0
"""How often a round forgets the records older than that."""
RETRY_MOST = 100_000
"""Copies on nodes that could not be reached, kept to delete on their return, at most."""
Run = Callable[..., Awaitable[Any]]
"""Runs a blocking function on an engine thread."""
ListNodes = Callable[[], Awaitable[list[NodeState]]]
"""The registered data nodes, each ``alive`` or not (``MetaService._list_nodes``)."""


class CollectMetrics:
    """What the collection rounds report."""

    def __init__(self, metrics: Metrics) -> None:
        self.waiting = metrics.gauge(
            "graben_collect_waiting_chunks",
            "Chunks no file uses, not yet collected, as the last round found them",
        )
        self.waiting_bytes = metrics.gauge(
            "graben_collect_waiting_bytes",
            "Their bytes on the data nodes (every copy and piece), as the last round found them",
        )
        self.freed = metrics.counter(
            "graben_collect_freed_chunks", "Chunks (and pieces) this service's rounds collected"
        )
        self.freed_bytes = metrics.counter(
            "graben_collect_freed_bytes", "Bytes of copies and pieces their rounds deleted"
        )
        self.kept = metrics.counter(
            "graben_collect_kept_copies",
            "Copies a node kept: written again since their chunk lost its last reference",
        )
        self.failed = metrics.counter(
            "graben_collect_failed_deletes",
            "Copies that could not be deleted (node unreachable): orphans, fsck's to collect",
        )


class Collector:
    """Collection rounds over the chunk records and the data nodes, fenced by the lease."""

    def __init__(
        self,
        records: ChunkRecords,
        chunks: RemoteChunks,
        run: Run,
        fence: Callable[[], int],
        *,
        grace_s: float = COLLECT_GRACE_S,
        per_round: int = COLLECT_CHUNKS,
        metrics: CollectMetrics | None = None,
        list_nodes: ListNodes | None = None,
    ) -> None:
        if not grace_s >= 0:
            raise InvalidArgument(f"the collection grace must be 0 s or more, not {grace_s}")
        if per_round < 1:
            raise InvalidArgument(f"a collection round takes 1 chunk or more, not {per_round}")
        self._records, self._chunks, self._run, self._fence = records, chunks, run, fence
        self.grace_s, self.per_round = grace_s, per_round
        self._metrics = metrics
        self._expired_at = -math.inf
        self._list_nodes = list_nodes
        self._unreached: dict[str, dict[str, float]] = {}
        """Node -> chunk -> cutoff (s): copies a round could not delete, for its return."""

    async def once(self) -> int:
        """Collect a round's share; chunks and pieces forgotten (their copies deleted,
        or left as orphans where a node could not be reached).

        Only while leading: ``Deposed`` if the lease is lost before the forgetting."""
        fence = self._fence()
        forgotten: list[Forgotten] = []
        if not math.isinf(self.grace_s):
            forgotten = await self._run(self._records.collect, self.grace_s, self.per_round, fence)
        if forgotten:
            await self._chunks.nodes()  # fresh addresses
            await self._delete(forgotten)
        if self._unreached:
            await self._delete_on_return()
        if time.monotonic() - self._expired_at > EXPIRE_EVERY_S:
            before = time.time() - KEEP_RECORDS_S
            await self._run(self._records.expire_collected, before, fence)
            self._expired_at = time.monotonic()
        if self._metrics is not None:
            state = await self._run(self._records.collection)
            self._metrics.waiting.set(state.waiting)
            self._metrics.waiting_bytes.set(state.waiting_bytes)
        return len(forgotten)

    async def _delete(self, forgotten: list[Forgotten]) -> None:
        """Every copy of what a round forgot, under its chunk's cutoff."""
        slots = asyncio.Semaphore(DELETES_AT_ONCE)

        async def delete(node: str, ref: ChunkRef, cutoff_ns: int) -> int | GrabenError:
            """Bytes freed (0: the node kept a copy written since), or why not (the copy
            is then kept for the node's return)."""
            async with slots:
                try:
                    gone = await self._chunks.delete(node, ref.id, cutoff_ns / 1e9)
                except GrabenError as exc:
                    self._remember(node, ref.id, cutoff_ns / 1e9)
                    return exc
            return ref.length if gone else 0

        outcomes = await asyncio.gather(
            *(delete(node, ref, cut) for ref, nodes, cut in forgotten for node in nodes)
        )
        freed = [o for o in outcomes if isinstance(o, int)]
        failed = [o for o in outcomes if isinstance(o, GrabenError)]
        kept = freed.count(0)
        log.info(
            "collected %d chunks and pieces unused for %g s: %d copies deleted (%d bytes)%s",
            len(forgotten),
            self.grace_s,
            len(freed) - kept,
            sum(freed),
            f", {kept} kept (written again since)" if kept else "",
        )
        if failed:
            log.warning(
                "could not delete %d copies of collected chunks (first: %s): deleted when "
                "their nodes heartbeat again",
                len(failed),
                failed[0].message,
            )
        if self._metrics is not None:
            self._metrics.freed.inc(len(forgotten))
            self._metrics.freed_bytes.inc(sum(freed))
            self._metrics.kept.inc(kept)
            self._metrics.failed.inc(len(failed))

    def _remember(self, node: str, chunk: str, cutoff: float) -> None:
        """A copy to delete when ``node`` is back (beyond ``RETRY_MOST``: the sweep's)."""
        if sum(map(len, self._unreached.values())) < RETRY_MOST:
            self._unreached.setdefault(node, {})[chunk] = cutoff

    async def _delete_on_return(self) -> None:
        """Delete the copies remembered on nodes that heartbeat again; forget those of
        nodes no longer registered (removed)."""
        if self._list_nodes is None:
            return
        nodes = {n.id: n.alive for n in await self._list_nodes()}
        for node in [n for n in self._unreached if n not in nodes]:
            del self._unreached[node]
        back = [n for n in self._unreached if nodes.get(n)]
        slots = asyncio.Semaphore(DELETES_AT_ONCE)

        async def delete(node: str, chunk: str, cutoff: float) -> bool:
            async with slots:
                try:
                    return await self._chunks.delete(node, chunk, cutoff)
                except GrabenError:
                    self._remember(node, chunk, cutoff)
                    return False

        for node in back:
            copies = self._unreached.pop(node)
            gone = await asyncio.gather(*(delete(node, c, cut) for c, cut in copies.items()))
            log.info(
                "deleted %d of %d copies of collected chunks on data node %s, which is back",
                sum(gone),
                len(copies),
                node,
            )
