"""Reading a chunk kept erasure-coded: its K data pieces, or any K pieces and a decode.

The data pieces are the chunk's bytes (``store/_classes/_erasure.py``), so a read
of a healthy stripe fetches them side by side from their K nodes straight
into the caller's buffer (only the last, padded piece lands in a scratch
buffer first) and decodes nothing. A piece that is missing, damaged or on a
node that does not answer is reported like a damaged copy, and as many
parity pieces as are then needed are fetched; the chunk is decoded from the
K pieces at hand in two worker threads, a half of each piece's bytes each
(zfec lets go of the GIL). A node that refused or missed a deadline is noted
slow, as for replicas: for a while, reads take parity in place of its pieces
from the start instead of asking it first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from .._classes import erasure
from .._errors import GrabenError, IntegrityError, NotFound, Timeout, Unavailable
from .._types import Extent, Stripe
from ..transport import ChunkTransport
from ._slow import SlowNodes

_RETRYABLE = (IntegrityError, NotFound, Unavailable, Timeout)
ReportDamage = Callable[[str, str, str], None]
"""(piece id, node, reason): report a damaged piece; the read does not wait."""
Failure = Callable[[Extent, list[GrabenError]], GrabenError]
"""The one error to raise when a chunk cannot be read, from the errors met."""


class Striped:
    """Reads of erasure-coded chunks over the data nodes' transport."""

    def __init__(
        self,
        chunks: ChunkTransport,
        report_damage: ReportDamage,
        failure: Failure,
        slow: SlowNodes | None = None,
    ) -> None:
        self._chunks, self._report_damage, self._failure = chunks, report_damage, failure
        self._slow = slow
        """Nodes that missed a deadline or refused a read lately: their pieces are left
        for parity at once (a second round trip per chunk saved)."""

    async def fetch(self, extent: Extent, stripe: Stripe, into: memoryview) -> None:
        """Fill ``into`` with the extent's whole chunk, from its stripe."""
        length, k = extent.chunk.length, stripe.k
        size = erasure.piece_length(length, k)
        errors: list[GrabenError] = []
        order = sorted(range(k + stripe.m), key=lambda i: (not self._usable(stripe, i), i))
        first, spare = order[:k], order[k:]
        wanted = {i: _dest(into, i, size, length) if i < k else _scratch(size) for i in first}
        have = await self._pieces(stripe, wanted, errors, bool(spare))
        while len(have) < k and spare:
            wave, spare = spare[: k - len(have)], spare[k - len(have) :]
            more = {i: _scratch(size) for i in wave}
            have.update(await self._pieces(stripe, more, errors, bool(spare)))
        if len(have) < k:
            raise self._failure(extent, errors)
        if all(i in have for i in range(k)):
            for i in range(k):  # the padded pieces came to scratch buffers
                start = i * size
                if start + size > length and start < length:
                    into[start:length] = have[i][: length - start]
            return
        # Two halves of the columns side by side: a decode is CPU, one core each.
        halves = (slice(0, size // 2), slice(size // 2, size))
        whole = into[:length]
        await asyncio.gather(
            *(asyncio.to_thread(erasure.decode, have, k, stripe.m, whole, h) for h in halves)
        )

    def _usable(self, stripe: Stripe, index: int) -> bool:
        node = stripe.nodes[index]
        return bool(node) and (self._slow is None or not self._slow.slow(node))

    async def _pieces(
        self,
        stripe: Stripe,
        wanted: dict[int, memoryview],
        errors: list[GrabenError],
        bounded: bool,
    ) -> dict[int, memoryview]:
        """The pieces ``wanted`` names read into their buffers, side by side; those read.
        ``bounded``: other pieces remain, so a node past the deadline is given up."""
        reads = (self._piece(stripe, i, d, errors, bounded) for i, d in wanted.items())
        got = await asyncio.gather(*reads)
        return {i: wanted[i] for i, ok in zip(wanted, got, strict=True) if ok}

    async def _piece(
        self,
        stripe: Stripe,
        index: int,
        into: memoryview,
        errors: list[GrabenError],
        bounded: bool,
    ) -> bool:
        piece, node = stripe.pieces[index], stripe.nodes[index]
        if not node:
            errors.append(NotFound(f"piece {index} of the stripe is on no node (being repaired)"))
            return False
        try:
            if self._slow is not None and bounded:
                await self._slow.bounded(node, self._chunks.read(node, piece, into), piece.length)
            else:
                await self._chunks.read(node, piece, into)
        except _RETRYABLE as exc:
            errors.append(exc)
            if isinstance(exc, (IntegrityError, NotFound)):
                self._report_damage(piece.id, node, exc.message)
            elif self._slow is not None:
                self._slow.note(node)  # refused or gone: ask others first for a while
            return False
        return True


def _scratch(size: int) -> memoryview:
    return memoryview(bytearray(size))


def _dest(into: memoryview, index: int, size: int, length: int) -> memoryview:
    """Where data piece ``index`` is read to: its place in ``into``, or a scratch buffer
    for the last piece, which is padded past the chunk's end."""
    if (index + 1) * size <= length:
        return into[index * size : (index + 1) * size]
    return memoryview(bytearray(size))
