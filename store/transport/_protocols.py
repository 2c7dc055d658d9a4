"""The transport seam: what a client needs from a store, local or remote.

A client talks to two things: the metadata service (``MetaTransport``: one
``request`` method carrying the typed requests of ``_requests.py``) and the
data nodes (``ChunkTransport``: whole-chunk writes and verified reads by node
id). The embedded store implements both in-process (the ``embedded`` layer);
the cluster implements them over the wire (``_remote.py``). Every client
feature is written once against these two protocols.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from .._types import ChunkRef, Receipt
from ._requests import Request

R = TypeVar("R")


class MetaTransport(Protocol):
    """Sends metadata requests."""

    async def request(self, request: Request[R]) -> R:
        """Execute one request; raises the ``GrabenError`` the service raised."""

    async def close(self) -> None:
        """Release connections and threads."""

    @property
    def local_read(self) -> Callable[[Request[Any]], Any] | None:
        """Run a read-only request in the calling thread, for an in-process store (no
        loop, no thread hand-off); ``None`` where requests cross a network."""


class ChunkTransport(Protocol):
    """Moves chunk bytes to and from nodes.

    Call order: ``write`` a chunk to each node a ``Placement`` names before
    committing a file that uses it; ``read`` any node a ``FileLayout`` lists.
    """

    @property
    def prefetch_window(self) -> int:
        """How many chunks ahead a sequential reader should hint (0: hints are useless)."""

    @property
    def local_read(self) -> Callable[[str, ChunkRef, memoryview], None] | None:
        """A blocking ``read`` any thread may call, when the chunks are on this
        host (embedded stores); ``None`` for remote transports."""

    async def nodes(self) -> tuple[str, ...]:
        """Node ids this transport can reach."""

    async def write(self, node: str, chunk: ChunkRef, data: memoryview) -> Receipt | None:
        """Store ``data`` durably as ``chunk`` on ``node``; returns after the node's fsync,
        with the node's receipt (``None`` where none is made: an embedded store)."""

    async def read(self, node: str, chunk: ChunkRef, into: memoryview) -> None:
        """Fill ``into[:chunk.length]``; raises ``IntegrityError`` if the crc32c does not match."""

    async def prefetch(self, node: str, chunks: Sequence[ChunkRef]) -> int:
        """A hint that ``chunks`` will be read soon from ``node``.

        Returns how many were not at hand and are now on their way (0 tells
        the reader it may hint less often).
        """

    async def inventory(self, node: str, store: str, after: str = "") -> list[tuple[str, float]]:
        """A page of the chunk files on ``node`` with their mtimes, ids after ``after`` in
        order, for fsck and collection; empty after the last. ``store``: the store's id,
        which the node must belong to."""

    async def temporaries(
        self, node: str, store: str, after: str = ""
    ) -> list[tuple[str, int, float]]:
        """A page of ``node``'s writers' temporaries: (name, bytes, mtime), as ``inventory``."""

    async def clean(self, node: str, store: str, older_than: float) -> tuple[int, int]:
        """Remove ``node``'s temporaries last written before ``older_than``: (count, bytes)."""

    async def adoption(self, node: str, store: str, *, vouch: bool = False) -> bool:
        """Whether ``node``'s chunk files predate its store id (it took the id over chunks
        already there: nothing shows they belong to this store); ``vouch`` drops that."""

    async def delete(self, node: str, chunk_id: str, older_than: float) -> bool:
        """Delete a copy not (re)written since ``older_than``; whether it went."""

    def describe(self, node: str, chunk_id: str) -> str:
        """Where a copy lives, for error messages."""

    def describe_temporary(self, node: str, name: str) -> str:
        """Where a temporary lives, for reports."""

    async def close(self) -> None:
        """Release connections and threads."""
