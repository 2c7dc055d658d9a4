"""The leader's repair rounds: damaged copies deleted, short chunks copied to new nodes,
lost pieces of stripes made again, draining nodes emptied (``_drain.py``: their copies
count as short, and are forgotten once copied), and, once nothing is short, copies moved
from fuller nodes to emptier ones (``_rebalance.py``). Only while leading: every round checks
the fence.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import msgspec

from .._errors import GrabenError
from .._types import NodeState
from ..transport import RemoteChunks
from ..wire import Metrics
from ._chunks import ChunkRecords
from ._convert import Converter
from ._drain import Drains
from ._placement import place
from ._rebalance import Rebalancer
from ._repo import Degraded

log = logging.getLogger("graben.meta")
REPAIR_CHUNKS = 32  # chunks copied at once by a round of repair...
REPAIR_BYTES = 256 * 1024 * 1024  # ...and the most bytes they may hold in memory
DEGRADED_PAGE = 1000  # short chunks a round looks at (``ChunkRecords.degraded``'s page)
Run = Callable[..., Awaitable[Any]]
"""Runs a blocking function on an engine thread."""


class RepairMetrics:
    """What the repair rounds report (set at the end of each round)."""

    def __init__(self, metrics: Metrics) -> None:
        self.short = metrics.gauge(
            "graben_chunks_short",
            "Chunks short of copies on live nodes, as the last repair round found them "
            "(counted up to 1000, a round's batch)",
        )
        self.queue = metrics.gauge(
            "graben_repair_queue",
            "Repairs waiting: short chunks the last round could not top up, and damaged "
            "copies awaiting deletion",
        )
        self.copies = metrics.counter("graben_repair_copies", "Copies and pieces made by repair")
        self.converted = metrics.counter("graben_chunks_converted", "Chunks converted to a class")


class Repairs:
    """Repair rounds over the chunk records and the data nodes, fenced by the lease."""

    def __init__(
        self,
        records: ChunkRecords,
        chunks: RemoteChunks,
        converter: Converter,
        run: Run,
        fence: Callable[[], int],
        list_nodes: Callable[[], Awaitable[list[NodeState]]],
        metrics: RepairMetrics | None,
        drains: Drains | None = None,
        rebalancer: Rebalancer | None = None,
    ) -> None:
        self._records, self._chunks, self._converter = records, chunks, converter
        self._run, self._fence, self._list_nodes = run, fence, list_nodes
        self._metrics, self._drains, self._rebalancer = metrics, drains, rebalancer

    def converted(self, made: int) -> None:
        """Count chunks a conversion round made."""
        if self._metrics is not None:
            self._metrics.converted.inc(made)

    async def once(self) -> int:
        """Delete reported bad copies, copy short chunks to new nodes and make lost pieces
        of stripes again; copies and pieces made.

        Only while leading: ``Deposed`` if the lease is lost before or during the round.
        """
        self._fence()
        await self._drop_bad()
        nodes = await self._list_nodes()
        await self._chunks.nodes()  # fresh addresses: a node back from the dead may have moved
        # A draining node's pieces are made again elsewhere, as if it were gone.
        staying = [msgspec.structs.replace(n, alive=False) if n.state else n for n in nodes]
        pieces = await self._converter.repair_stripes(staying)
        degraded: list[Degraded] = await self._run(self._records.degraded)
        await self._sweep(nodes, degraded)
        if not degraded:
            await self._report_round(0, 0, pieces)
            if self._rebalancer is not None:  # only once nothing is short: repair comes first
                await self._rebalancer.once(nodes)
            return pieces
        made, left, stuck, lost = 0, 0, list[tuple[str, str]](), list[str]()
        for batch in _repair_batches(degraded):
            # Chunks of a batch are copied at once (a copy is a read and a write, each a
            # round trip; one at a time, a node's thousands of small chunks took
            # minutes) and their new copies recorded in one transaction, under the
            # fence held when they began (a leader deposed meanwhile is refused).
            fence = self._fence()
            copied = await asyncio.gather(
                *(self._repair(chunk, nodes, stuck, lost) for chunk in batch),
                return_exceptions=True,
            )
            done: dict[str, tuple[str, ...]] = {}
            for chunk, outcome in zip(batch, copied, strict=True):
                if isinstance(outcome, BaseException):
                    raise outcome  # Deposed: the others' copies are left unrecorded
                if outcome:
                    done[chunk.chunk.id] = outcome
                made += len(outcome)
                left += len(outcome) < chunk.want - len(chunk.live)
            if done:
                await self._run(self._records.record_copies, done, fence)
        made += pieces
        await self._report_round(len(degraded), left, made)
        # One line per round, not one per chunk: a cluster short of nodes would say
        # the same thing for every chunk, every round.
        if lost:
            log.error(
                "%d chunks have no live copy left and cannot be repaired (first: %s)",
                len(lost),
                lost[0],
            )
        if stuck:
            log.warning(
                "cannot repair %d chunks yet: %s (first: %s)", len(stuck), stuck[0][1], stuck[0][0]
            )
        return made

    async def _sweep(self, nodes: list[NodeState], degraded: list[Degraded]) -> None:
        """Forget and delete the draining copies of chunks copied elsewhere (by an earlier
        round: a copy made now is recorded after this) while ``degraded`` is complete."""
        if self._drains is None or len(degraded) >= DEGRADED_PAGE:
            return
        short = {d.chunk.id for d in degraded}
        gone = await self._run(self._drains.sweep, nodes, short, self._fence())
        for chunk, node in gone:
            try:
                await self._chunks.delete(node, chunk, math.inf)
            except GrabenError as exc:  # an orphan on a node that is leaving anyway
                log.info("could not delete the drained copy of %s on %s: %s", chunk, node, exc)
        if gone:
            log.info("moved %d copies off draining nodes", len(gone))

    async def _report_round(self, short: int, left: int, made: int) -> None:
        """A repair round's outcome in the metrics, if any."""
        if self._metrics is not None:
            bad: int = await self._run(self._records.bad_count)
            self._metrics.short.set(short)
            self._metrics.queue.set(left + bad)
            self._metrics.copies.inc(made)

    async def _drop_bad(self) -> None:
        """Delete the copies reported damaged (to this service or any other)."""
        bad: list[tuple[str, str, str]] = await self._run(self._records.bad_copies)
        for chunk, node, reason in bad:
            await self._converter.drop(chunk, node, reason)

    async def _repair(
        self,
        degraded: Degraded,
        nodes: list[NodeState],
        stuck: list[tuple[str, str]],
        lost: list[str],
    ) -> tuple[str, ...]:
        """The nodes a short chunk was copied to (not yet recorded); one that cannot be
        placed goes on ``stuck`` with the reason, one with no live copy on ``lost``."""
        chunk = degraded.chunk
        sources = (*degraded.live, *degraded.draining)
        if not sources:
            lost.append(chunk.id)
            return ()
        try:
            targets = place(
                nodes,
                degraded.want - len(degraded.live),
                chunk.id,
                chunk.length,
                exclude=sources,
                minimum=1,  # some copies now beat all of them later
            )
        except GrabenError as exc:
            stuck.append((chunk.id, str(exc)))
            return ()
        data = memoryview(bytearray(chunk.length))
        if not await self._converter.read_any(chunk, sources, data, "repair"):
            return ()
        self._fence()  # a data node cannot check the fence: look before writing
        results = await asyncio.gather(
            *(self._chunks.write(node, chunk, data) for node in targets), return_exceptions=True
        )
        return tuple(
            node
            for node, r in zip(targets, results, strict=True)
            if not isinstance(r, BaseException)
        )


def _repair_batches(degraded: list[Degraded]) -> Iterator[list[Degraded]]:
    """``degraded`` in batches of at most ``REPAIR_CHUNKS`` chunks and ``REPAIR_BYTES``
    (a batch has at least one chunk, however large)."""
    batch: list[Degraded] = []
    held = 0
    for chunk in degraded:
        if batch and (len(batch) == REPAIR_CHUNKS or held + chunk.chunk.length > REPAIR_BYTES):
            yield batch
            batch, held = [], 0
        batch.append(chunk)
        held += chunk.chunk.length
    if batch:
        yield batch
