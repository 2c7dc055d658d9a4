"""Reading a chunk kept erasure-coded: its K data pieces, or any K pieces and a decode.

The data pieces are the chunk's bytes (``transport/_erasure.py``), so a read
of a healthy stripe fetches them side by side from their K nodes straight
into the caller's buffer (only the last, padded piece lands in a scratch
buffer first) and decodes nothing. A piece that is missing, damaged or on a
node that does not answer is reported like a damaged copy, and as many
parity pieces as are then needed are fetched; the chunk is decoded from the
K pieces at hand in a worker thread (zfec lets go of the GIL).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from .._errors import GrabenError, IntegrityError, NotFound, Timeout, Unavailable
from .._types import Extent, Stripe
from ..transport import ChunkTransport
from ..transport import _erasure as erasure

_RETRYABLE = (IntegrityError, NotFound, Unavailable, Timeout)
Tell = Callable[[str, str, str], None]
"""(piece id, node, reason): report a damaged piece; the read does not wait."""
Failure = Callable[[Extent, list[GrabenError]], GrabenError]
"""The one error to raise when a chunk cannot be read, from the errors met."""


class Striped:
    """Reads of erasure-coded chunks over the data nodes' transport."""

    def __init__(self, chunks: ChunkTransport, tell: Tell, failure: Failure) -> None:
        self._chunks, self._tell, self._failure = chunks, tell, failure

    async def fetch(self, extent: Extent, stripe: Stripe, into: memoryview) -> None:
        """Fill ``into`` with the extent's whole chunk, from its stripe."""
        length, k = extent.chunk.length, stripe.k
        size = erasure.piece_length(length, k)
        errors: list[GrabenError] = []
        wanted = {i: _dest(into, i, size, length) for i in range(k)}
        have = await self._pieces(stripe, wanted, errors)
        if len(have) == k:
            for i in range(k):  # the padded pieces came to scratch buffers
                start = i * size
                if start + size > length and start < length:
                    into[start:length] = have[i][: length - start]
            return
        spare = list(range(k, k + stripe.m))
        while len(have) < k and spare:
            wave, spare = spare[: k - len(have)], spare[k - len(have) :]
            more = await self._pieces(
                stripe, {i: memoryview(bytearray(size)) for i in wave}, errors
            )
            have.update(more)
        if len(have) < k:
            raise self._failure(extent, errors)
        await asyncio.to_thread(erasure.decode, have, k, stripe.m, into[:length])

    async def _pieces(
        self, stripe: Stripe, wanted: dict[int, memoryview], errors: list[GrabenError]
    ) -> dict[int, memoryview]:
        """The pieces ``wanted`` names read into their buffers, side by side; those read."""
        got = await asyncio.gather(*(self._piece(stripe, i, d, errors) for i, d in wanted.items()))
        return {i: wanted[i] for i, ok in zip(wanted, got, strict=True) if ok}

    async def _piece(
        self, stripe: Stripe, index: int, into: memoryview, errors: list[GrabenError]
    ) -> bool:
        piece, node = stripe.pieces[index], stripe.nodes[index]
        if not node:
            errors.append(NotFound(f"piece {index} of the stripe is on no node (being repaired)"))
            return False
        try:
            await self._chunks.read(node, piece, into)
        except _RETRYABLE as exc:
            errors.append(exc)
            if isinstance(exc, (IntegrityError, NotFound)):
                self._tell(piece.id, node, exc.message)
            return False
        return True


def _dest(into: memoryview, index: int, size: int, length: int) -> memoryview:
    """Where data piece ``index`` is read to: its place in ``into``, or a scratch buffer
    for the last piece, which is padded past the chunk's end."""
    if (index + 1) * size <= length:
        return into[index * size : (index + 1) * size]
    return memoryview(bytearray(size))
