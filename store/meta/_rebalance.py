"""The leader's rebalancing: emptier nodes take copies from fuller ones, at a set pace.

Each repair round, while some node in service holds more (or less) than the mean of
the chunk bytes the engine records on nodes in service by more than ``band`` of it,
the fullest node's copies of referenced chunks are copied to the emptiest node and
then forgotten and deleted on the fullest, until either reaches the mean or the
round's allowance is spent: ``rate`` bytes for each second since the last round (at
most ``ROUND_S``), nothing saved from a quiet round; a chunk larger than that moves
alone and its excess is owed by the next rounds.
A copy moves only to a node of the same rack or of a rack holding none of the chunk's
other copies, so failure domains are never fewer; nodes draining (``_drain.py``), dead
or without room (``RESERVE``) take nothing. Erasure-coded pieces stay where they are.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from .._config import RESERVE
from .._errors import GrabenError
from .._types import ChunkRef, NodeState
from ..transport import RemoteChunks
from ._convert import Converter
from ._leader import fenced_write
from ._repo import Repository, Tx

log = logging.getLogger("graben.meta")
REBALANCE_RATE = 16 << 20
"""Bytes a second rebalancing moves at most, by default (``--rebalance-rate``)."""
BAND = 0.10
"""How far from the mean a node's bytes may be before rebalancing moves copies."""
ROUND_S = 10.0
"""Most seconds of ``rate`` one round may spend."""
MOVES_AT_ONCE = 16
"""Copies one step moves at once (each a read and a write)."""


class Rebalancer:
    """Moves copies from fuller to emptier nodes, ``rate`` bytes a second at most."""

    def __init__(
        self,
        repo: Repository,
        chunks: RemoteChunks,
        converter: Converter,
        fence: Callable[[], int],
        rate: float,
        band: float = BAND,
    ) -> None:
        self.repo, self._chunks, self._converter, self._fence = repo, chunks, converter, fence
        self.rate, self.band = rate, band
        self._allowance, self._last = 0.0, time.monotonic()

    async def once(self, nodes: list[NodeState]) -> int:
        """Move copies while the bytes allow and some node is out of the band; copies moved."""
        now = time.monotonic()
        since, self._last = min(now - self._last, ROUND_S), now
        self._allowance = min(self._allowance, 0.0) + self.rate * since  # debts carry over
        serving = {n.id: n for n in nodes if n.alive and not n.state}
        if self.rate <= 0 or len(serving) < 2:
            return 0
        with self.repo.read() as tx:
            held = tx.nodes.held_bytes()
        loads = {node: held.get(node, 0) for node in serving}
        moved = 0
        while self._allowance > 0:
            step = await self._step(serving, loads)
            if not step:
                break
            moved += step
        if moved:
            log.info("rebalancing: moved %d copies; %s", moved, _spread(loads))
        return moved

    async def _step(self, serving: dict[str, NodeState], loads: dict[str, int]) -> int:
        """Up to ``MOVES_AT_ONCE`` copies from the fullest node to the emptiest."""
        mean = sum(loads.values()) / len(loads)
        src, dst = max(loads, key=loads.__getitem__), min(loads, key=loads.__getitem__)
        if max(loads[src] - mean, mean - loads[dst]) <= self.band * mean:
            return 0
        with self.repo.read() as tx:
            found = tx.nodes.movable(src, dst, MOVES_AT_ONCE * 4)
            holders = tx.chunks.replicas(ref.id for ref in found)
        racks = {n.id: n.rack for n in serving.values()}
        room = serving[dst].free - RESERVE
        picked: list[ChunkRef] = []
        for ref in found:
            others = {racks.get(n, "") for n in holders.get(ref.id, ()) if n != src}
            wanted = min(loads[src] - mean, mean - loads[dst]) - sum(p.length for p in picked)
            if len(picked) == MOVES_AT_ONCE or wanted <= 0 or room < ref.length:
                break
            if self._allowance < ref.length and (picked or self._allowance <= 0):
                break  # one chunk larger than the allowance moves alone, owed
            if racks[dst] == racks[src] or racks[dst] not in others:
                picked.append(ref)
                room -= ref.length
                self._allowance -= ref.length
        if not picked:
            return 0
        done = await self._move(picked, src, dst)
        for ref in done:
            loads[src] -= ref.length
            loads[dst] += ref.length
        return len(done)

    async def _move(self, refs: list[ChunkRef], src: str, dst: str) -> list[ChunkRef]:
        """Copy ``refs`` from ``src`` to ``dst``, record the move, delete the old copies."""
        started = time.time()  # a copy on src written again since (a new upload) stays
        copied = await asyncio.gather(*(self._copy(ref, src, dst) for ref in refs))
        made = [ref for ref, ok in zip(refs, copied, strict=True) if ok]
        if not made:
            return []
        moved = set(
            fenced_write(
                self.repo,
                self._fence(),
                f"moving {len(made)} copies from {src} to {dst}",
                lambda tx: _record(tx, [r.id for r in made], src, dst),
            )
        )
        # A copy not moved (its chunk left src meanwhile: collected, drained) stays on
        # dst: a writer of the same bytes may have committed it there since. If nothing
        # names it, it is an orphan, the sweep's (``_sweep.py``).
        for ref in made:
            if ref.id not in moved:
                continue
            try:
                await self._chunks.delete(src, ref.id, started)
            except GrabenError as exc:
                log.info("could not delete the moved copy of %s on %s: %s", ref.id, src, exc)
        return [ref for ref in made if ref.id in moved]

    async def _copy(self, ref: ChunkRef, src: str, dst: str) -> bool:
        data = memoryview(bytearray(ref.length))
        if not await self._converter.read_any(ref, [src], data, "rebalance"):
            return False
        self._fence()  # a data node cannot check the fence: look before writing
        try:
            await self._chunks.write(dst, ref, data)
        except GrabenError as exc:
            log.warning("rebalancing: could not copy %s to %s: %s", ref.id, dst, exc)
            return False
        return True


def _record(tx: Tx, chunks: list[str], src: str, dst: str) -> list[str]:
    """Move the copies of ``chunks`` still recorded on ``src`` to ``dst``; those moved."""
    held = tx.chunks.replicas(chunks)
    moved = [chunk for chunk in chunks if src in held.get(chunk, ())]
    for chunk in moved:
        tx.chunks.add_replicas(chunk, (dst,))
        tx.chunks.drop_replica(chunk, src)
    return moved


def _spread(loads: dict[str, int]) -> str:
    mean = sum(loads.values()) / len(loads)
    worst = max(abs(v - mean) for v in loads.values())
    return f"{mean / 2**20:.1f} MiB a node on average, {worst / 2**20:.1f} MiB the furthest off"
