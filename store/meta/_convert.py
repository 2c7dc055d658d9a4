"""The leader's erasure-coding duties: converting chunks to stripes, repairing stripes.

A conversion reads a chunk from one of its copies, cuts and encodes it into
K + M pieces (in a worker thread: zfec and blake3 let go of the GIL), places
the pieces on K + M distinct nodes (racks first, as replicas are), writes
them, and only then records the stripe: one fenced transaction that swaps
the chunk's replica rows for its piece rows and queues the old copies for
deletion; they are deleted at once (a leader killed first leaves them to
the next round, which deletes them as it does damaged copies).
Until that commit readers use the copies; after it, the pieces. A leader
killed in between leaves pieces no metadata names (fsck's orphans) and the
copies untouched; the next leader converts the chunk again, to the same
pieces (the encoding is a function of the bytes), and records it.

A chunk of class ``s3`` goes the same way to the cluster's S3 tier: its
object put, then its copies swapped for it (a stripe of one piece on the
node ``IN_TIER``).

Stripe repair finds pieces on no live node, reads any K live pieces,
rebuilds the missing ones and writes each to a node that holds no piece of
that stripe, then records where they went.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from msgspec.structs import replace

from .._classes import StorageClass, erasure
from .._errors import GrabenError, IntegrityError, NotFound
from .._hashing import content_id, crc32c
from .._types import ChunkRef, FileLayout, NodeState, Stripe
from ..tier import Bucket
from ..transport import ChunkPage, RemoteChunks
from ._chunks import ChunkRecords
from ._classes import Classes, Conversion
from ._placement import live_first, place
from ._repo import IN_TIER

log = logging.getLogger("graben.meta")
CONVERT_CHUNKS = 16
"""Chunks one round converts at most (the next round takes the next ones)."""
Run = Callable[..., Awaitable[Any]]


class Converter:
    """The leader's conversions and stripe repairs, over its engine and data nodes."""

    def __init__(
        self,
        classes: Classes,
        records: ChunkRecords,
        chunks: RemoteChunks,
        run: Run,
        fence: Callable[[], int],
        tier: str | None = None,
    ) -> None:
        """``tier``: the cluster's S3 tier (``s3://BUCKET/PREFIX``): ``classes`` then
        takes class ``s3`` too."""
        self._classes, self._records = classes, records
        self._chunks, self._run, self._fence = chunks, run, fence
        self._bucket = None if tier is None else Bucket(tier)
        if self._bucket is not None:
            classes.kinds = classes.kinds | {"s3"}
        self.converted = 0
        """Chunks converted since the service started."""

    async def convert_once(self, nodes: list[NodeState]) -> int:
        """Convert up to ``CONVERT_CHUNKS`` chunks as their class says; how many."""
        kinds = frozenset({"ec", "s3"} if self._bucket is not None else {"ec"})
        work: list[Conversion] = await self._run(
            self._classes.to_convert, CONVERT_CHUNKS, None, kinds
        )
        if not work:
            return 0
        done = await asyncio.gather(
            *(self._convert(c, nodes) for c in work), return_exceptions=True
        )
        failed = [r for r in done if isinstance(r, BaseException)]
        for outcome in failed:
            if not isinstance(outcome, GrabenError):
                raise outcome  # Deposed, or a bug: not to be swallowed
        if failed:
            log.warning(
                "could not convert %d of %d chunks this round (first: %s)",
                len(failed),
                len(work),
                failed[0],
            )
        made = sum(1 for r in done if r is True)
        self.converted += made
        return made

    async def _convert(self, work: Conversion, nodes: list[NodeState]) -> bool:
        if work.target.kind == "s3":
            return await self._archive(work)
        chunk, target = work.chunk, work.target
        size = erasure.piece_length(chunk.length, target.k)
        targets = place(nodes, target.k + target.m, chunk.id, size)
        data = memoryview(bytearray(chunk.length))
        if not await self.read_any(chunk, work.replicas, data):
            return False
        pieces, refs = await asyncio.to_thread(_encode, data, target)
        self._fence()  # a data node cannot check the fence: look before writing
        await self._write_all(refs, pieces, targets)
        stripe = Stripe(target.k, target.m, tuple(refs), tuple(targets))
        why = f"replaced by its {target.name} stripe"
        old = await self._run(self._classes.record_stripe, chunk.id, stripe, why, self._fence())
        await self._drop_all(chunk.id, old, why)
        return True

    async def _archive(self, work: Conversion) -> bool:
        """A chunk to the S3 tier: its object put, then its copies swapped for it."""
        assert self._bucket is not None
        chunk = work.chunk
        data = memoryview(bytearray(chunk.length))
        if not await self.read_any(chunk, work.replicas, data):
            return False
        await self._bucket.put(chunk, data)
        stripe = Stripe(1, 0, (chunk,), (IN_TIER,))
        why = f"moved to the S3 tier {self._bucket.url}"
        old = await self._run(self._classes.record_stripe, chunk.id, stripe, why, self._fence())
        await self._drop_all(chunk.id, old, why)
        return True

    async def _drop_all(self, chunk: str, nodes: Sequence[str], why: str) -> None:
        """The copies a conversion replaced, deleted now rather than next round (a leader
        dying first leaves them queued for the next one)."""
        await asyncio.gather(*(self.drop(chunk, node, why, loud=False) for node in nodes))

    async def drop(self, chunk: str, node: str, reason: str, *, loud: bool = True) -> None:
        """Delete one copy queued for deletion (damaged, or replaced by its class), then
        forget it; a node that cannot be reached keeps it as an orphan (fsck's to collect)."""
        fence = self._fence()  # a data node cannot check the fence: look before each
        if loud:
            log.info("deleting bad copy of %s on %s (%s)", chunk, node, reason)
        try:
            await self._chunks.delete(node, chunk, math.inf)
        except GrabenError as exc:
            log.warning("could not delete the copy of %s on %s: %s", chunk, node, exc)
        await self._run(self._records.forget_bad, chunk, node, fence)

    async def _write_all(
        self, refs: Sequence[ChunkRef], pieces: Sequence[memoryview], targets: Sequence[str]
    ) -> None:
        """Every piece on its node, or ``GrabenError`` (those written stay as orphans)."""
        results = await asyncio.gather(
            *(self._chunks.write(n, r, p) for n, r, p in zip(targets, refs, pieces, strict=True)),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def read_any(
        self, chunk: ChunkRef, sources: Sequence[str], into: memoryview, why: str = "convert"
    ) -> bool:
        """Fill ``into`` from the first of ``sources`` that has the chunk whole (copies found
        damaged or gone are reported); whether one had (repair and conversion read so)."""
        for node in sources:
            try:
                await self._chunks.read(node, chunk, into)
                return True
            except (IntegrityError, NotFound) as exc:
                await self._run(
                    self._records.report_bad, chunk.id, node, exc.message, self._fence()
                )
            except GrabenError as exc:
                log.warning("could not read %s from %s to %s it: %s", chunk.id, node, why, exc)
        return False

    # -- repair ------------------------------------------------------------------

    async def repair_stripes(self, nodes: list[NodeState]) -> int:
        """Make again the pieces of stripes that lost some; pieces made."""
        alive = [n.id for n in nodes if n.alive]
        short = await self._run(self._classes.short_stripes, alive)
        made = 0
        for chunk, stripe in short:
            try:
                moved = await self._rebuild(chunk, stripe, nodes, set(alive))
            except GrabenError as exc:
                log.warning("cannot repair the stripe of %s yet: %s", chunk.id, exc)
                continue
            if moved:
                await self._run(self._classes.record_pieces, moved, self._fence())
                made += len(moved)
        return made

    async def _rebuild(
        self, chunk: ChunkRef, stripe: Stripe, nodes: list[NodeState], alive: set[str]
    ) -> list[tuple[str, int, str, str]]:
        lost = [i for i, n in enumerate(stripe.nodes) if n not in alive]
        have, failed = await self._gather(
            stripe, [i for i in range(len(stripe.nodes)) if i not in lost]
        )
        if len(have) < stripe.k:
            log.error(
                "chunk %s has %d of the %d pieces it needs: it cannot be rebuilt",
                chunk.id,
                len(have),
                stripe.k,
            )
            return []
        lost += failed
        made = await asyncio.to_thread(erasure.rebuild, have, stripe.k, stripe.m, lost)
        # Every node keeping a piece, not only those read: two pieces of one stripe on
        # one node would be lost together.
        holding = [n for i, n in enumerate(stripe.nodes) if i not in lost and n]
        targets = place(nodes, len(lost), chunk.id, stripe.pieces[0].length, exclude=holding)
        self._fence()
        refs = [stripe.pieces[i] for i in lost]
        await self._write_all(refs, [memoryview(made[i]) for i in lost], targets)
        return [(chunk.id, i, stripe.nodes[i], t) for i, t in zip(lost, targets, strict=True)]

    async def _gather(
        self, stripe: Stripe, indexes: list[int]
    ) -> tuple[dict[int, memoryview], list[int]]:
        """K pieces read whole from their nodes, by index, and the indexes of those found
        damaged or gone on the way."""
        have: dict[int, memoryview] = {}
        failed: list[int] = []
        for i in indexes:
            if len(have) == stripe.k:
                break
            piece, node = stripe.pieces[i], stripe.nodes[i]
            into = memoryview(bytearray(piece.length))
            try:
                await self._chunks.read(node, piece, into)
            except (IntegrityError, NotFound) as exc:
                await self._run(
                    self._records.report_bad, piece.id, node, exc.message, self._fence()
                )
                failed.append(i)
                continue
            except GrabenError:
                continue
            have[i] = into
        return have, failed


def _encode(data: memoryview, target: StorageClass) -> tuple[list[memoryview], list[ChunkRef]]:
    """The stripe's pieces of ``data`` and their records (on a worker thread)."""
    pieces = [memoryview(p) for p in erasure.encode(data, target.k, target.m)]
    refs = [ChunkRef(content_id(p), p.nbytes, crc32c(p)) for p in pieces]
    return pieces, refs


READ_THROUGH = 2
"""Data nodes a chunk of the S3 tier is read through (the second if the first fails)."""


def through_nodes(
    stripes: dict[str, Stripe], nodes: Sequence[NodeState]
) -> tuple[dict[str, Stripe], dict[str, tuple[str, ...]]]:
    """The stripes that are not chunks of the S3 tier; and for each of those, the data
    nodes to read it through: the best ``READ_THROUGH`` by the chunk's own placement,
    the same while they live, so their caches hold it."""
    kept: dict[str, Stripe] = {}
    through: dict[str, tuple[str, ...]] = {}
    for chunk, stripe in stripes.items():
        if stripe.nodes != (IN_TIER,):
            kept[chunk] = stripe
            continue
        piece = stripe.pieces[0]
        try:
            through[chunk] = place(nodes, READ_THROUGH, chunk, piece.length, minimum=1)
        except GrabenError:
            through[chunk] = ()  # no node up: the reader says so
    return kept, through


def for_readers(
    result: FileLayout | ChunkPage, nodes: Sequence[NodeState]
) -> FileLayout | ChunkPage:
    """A layout or chunk page as readers take it: each chunk of the S3 tier as copies on
    the nodes that read it through (``through_nodes``), copies on nodes gone silent last."""
    stripes, held = through_nodes(result.stripes, nodes)
    if isinstance(result, FileLayout):
        replicas = live_first({**result.replicas, **held}, nodes)
        return replace(result, replicas=replicas, stripes=stripes)
    if not held:
        return result
    chunks = [(c, held.get(c.id, copies)) for c, copies in result.chunks]
    return replace(result, chunks=chunks, stripes=stripes)
