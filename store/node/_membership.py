"""A data node's membership of its store: heartbeats to the metadata services, the
store it joined, and whether it has been let in (its encryption at rest checked
against the store's) before it stores any write.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec

from .._config import RESERVE
from .._errors import PermissionDenied, Unavailable
from .._types import NodeState
from ..transport import Heartbeat, Joined, RemoteMeta, Request
from ._chunkstore import LocalChunkStore
from ._identity import check_sealing, keep_store_id, read_id

log = logging.getLogger("graben.node")
HEARTBEAT_S = 2.0
LET_IN_S = 2 * HEARTBEAT_S
"""How long a write waits for the metadata service to let a node that just started in."""
Run = Callable[..., Awaitable[Any]]
"""Runs a blocking function on the node's I/O threads."""
WALK_SHARE = 50
"""The bytes graben's files take are counted again once this many times as long as the
last count took has passed (a small node's each heartbeat; a large one's, rarely)."""


class Membership:
    """One node's standing in its store, kept by its heartbeats."""

    def __init__(
        self, node: str, root: Path, rack: str, meta: RemoteMeta, store: LocalChunkStore, run: Run
    ) -> None:
        self.node, self.root, self.rack = node, root, rack
        self.meta, self._store, self._run = meta, store, run
        self.store_id = read_id(root / "store-id")
        """The store this node belongs to; ``None`` until its first heartbeat is answered."""
        self.address = ""
        """Where clients dial it, as its heartbeats say (set once it listens)."""
        self.metrics = ""
        """Where its ``/metrics`` are, as its heartbeats say (``""``: none)."""
        sealer = store.sealer
        self._sealed = "none" if sealer is None else sealer.check
        """What the heartbeats say of its encryption at rest (its key's check value)."""
        self.scrubbed = 0.0
        """Unix time the node's last full scrub pass ended (0: none yet), for the heartbeats."""
        self._stored, self._counted, self._took = 0, -float("inf"), 0.0
        """The bytes of graben's files, when they were counted and how long that took."""
        self._full = False
        """Whether its last heartbeat found less than ``RESERVE`` free (said once)."""
        self._let_in = asyncio.Event()
        """Set once a metadata service said the store's encryption is this node's: no write
        is stored before (a node that lost its record must not write plaintext into an
        encrypted store)."""

    async def request(self, request: Request[Any]) -> Any:
        """A request to whichever metadata service answers."""
        return await self.meta.request(request)

    async def admitted(self) -> None:
        """Return once a metadata service has let this node in (``Unavailable`` after
        ``LET_IN_S`` without one)."""
        if self._let_in.is_set():
            return
        try:
            await asyncio.wait_for(self._let_in.wait(), LET_IN_S)
        except TimeoutError:
            raise Unavailable(
                f"data node {self.node} stores nothing until a metadata service has let it in "
                "(its encryption at rest checked against the store's)"
            ) from None

    async def beat(self, *, first: bool = False) -> None:
        """Tell the metadata service this node is alive; ``first``: on starting, when a
        store whose encryption is not this node's is ``PermissionDenied`` (later, this
        node stops storing writes and says why)."""
        free, total = await self._run(self._store.capacity)
        self._say_if_full(free)
        state = NodeState(self.node, self.address, self.rack, free, total)
        stored, scrubbed = await self._stored_bytes(), self.scrubbed
        state = msgspec.structs.replace(
            state, stored=stored, scrubbed=scrubbed, metrics=self.metrics
        )
        beat = Heartbeat(state, self.store_id or "", sealed=self._sealed)
        try:
            joined: Joined = await self.request(beat)
        except PermissionDenied as exc:  # another store's metadata, or the wrong secret
            log.error(
                "the metadata service at %s refused this node: %s", self.meta.address, exc.message
            )
            return
        try:
            check_sealing(f"data node {self.node} ({self.root})", joined.sealed, self._store.sealer)
        except PermissionDenied as exc:
            self._let_in.clear()
            if first:
                raise
            log.error("%s; it stores no chunk", exc.message)
            return
        self._let_in.set()
        await self._joined(joined.store_id)

    async def _stored_bytes(self) -> int:
        """The bytes graben's files take under the node's directory, counted again when
        the last count is old enough (``WALK_SHARE``)."""
        now = time.monotonic()
        if now - self._counted >= WALK_SHARE * self._took:
            self._stored = await self._run(bytes_under, self.root)
            self._counted, self._took = now, time.monotonic() - now
        return self._stored

    def _say_if_full(self, free: int) -> None:
        """Log once when the disk falls below the reserve (placement then puts no new chunk
        here, so it never meets ENOSPC), and once when it has room again."""
        full = free < RESERVE
        if full and not self._full:
            log.warning(
                "data node %s: %d bytes free on %s, less than the %d kept in reserve: it "
                "takes no new chunks until space comes back",
                *(self.node, free, self.root, RESERVE),
            )
        elif self._full and not full:
            log.info("data node %s: %d bytes free again, taking new chunks", self.node, free)
        self._full = full

    async def _joined(self, store_id: str) -> None:
        if self.store_id is None:
            held = await self._run(keep_store_id, self.root, store_id, self._store)
            self.store_id = store_id
            log.info("data node %s joined store %s", self.node, self.store_id)
            if held:
                log.warning(
                    "data node %s had chunk files before it joined store %s: collection "
                    "keeps them until fsck --collect --force vouches for them",
                    self.node,
                    self.store_id,
                )
        elif store_id != self.store_id:  # a service that did not check: serve it nothing
            log.error(
                "the metadata service at %s serves store %s; this node belongs to store %s "
                "and refuses its capabilities and listings",
                self.meta.address,
                store_id,
                self.store_id,
            )


def bytes_under(root: Path) -> int:
    """Bytes the files under ``root`` take on its disk, as ``du`` counts them (a file gone
    while counted counts nothing)."""
    total = 0
    for entry in os.scandir(root):
        try:
            if entry.is_dir(follow_symlinks=False):
                total += bytes_under(Path(entry.path))
            elif entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_blocks * 512
        except FileNotFoundError:
            continue
    return total
