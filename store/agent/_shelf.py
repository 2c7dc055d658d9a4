"""Pure: which of an agent's segments may be dropped, and what a new one costs.

Rules (``droppable``), per job, rank and world size:

- a complete segment of the rank's own host is kept while it is among the
  newest ``keep`` complete ones, and after that until the store holds its
  step or a newer one (``stored``): memory never holds the only copy of a
  step and then lets it go;
- a peer's copy is kept while it is among the newest ``keep``;
- an incomplete segment is dropped once a newer step of the same rank
  exists (its writer died, or moved on), never while it may still be written.

``surplus`` is what an agent drops as soon as it may: all of that but one
spare per rank. ``room`` picks what to drop so a new segment fits under the limit, oldest
first and peers' copies before a host's own, preferring one the same size
as the new one (its pages are reused, so the rank's copy never waits for the
kernel to find fresh ones).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass

from ..transport import Held, SegmentKey


def droppable(
    held: Iterable[Held],
    stored: Mapping[str, int],
    keep: int,
    pinned: Set[SegmentKey] = frozenset(),
) -> list[Held]:
    """The segments the rules above let go, those to drop first first (never a host's own
    segment ``pinned``: one being copied to a peer)."""
    lines: dict[tuple[str, int, int, bool], list[Held]] = defaultdict(list)
    for h in held:
        lines[(h.key.job, h.key.rank, h.key.world, h.peer)].append(h)
    out: list[Held] = []
    for (job, _, _, peer), line in lines.items():
        line.sort(key=lambda h: h.key.step, reverse=True)
        complete = [h for h in line if h.complete]
        newest = line[0].key.step
        out += [h for h in line if not h.complete and h.key.step < newest]
        for h in complete[keep:]:
            if peer or h.key.step <= stored.get(job, -1):
                out.append(h)
    out = [h for h in out if h.peer or h.key not in pinned]
    return sorted(out, key=lambda h: (not h.peer, h.key.step))


def surplus(
    held: Iterable[Held],
    stored: Mapping[str, int],
    keep: int,
    pinned: Set[SegmentKey] = frozenset(),
) -> list[Held]:
    """What to drop now: every droppable segment but the newest of each rank's own, kept
    as a spare whose pages the rank's next save takes over (``room``)."""
    spares: dict[tuple[str, int, int], Held] = {}
    candidates = droppable(held, stored, keep, pinned)
    for h in candidates:
        if not h.peer:
            spares[(h.key.job, h.key.rank, h.key.world)] = h  # oldest first: the newest wins
    kept = {id(h) for h in spares.values()}
    return [h for h in candidates if id(h) not in kept]


@dataclass(frozen=True, slots=True)
class Room:
    """How a new segment fits: the one whose pages it takes over, the others dropped."""

    reuse: Held | None
    """A droppable segment of the same size, renamed to the new one (``None``: a new file)."""
    drop: list[Held]
    """Segments removed to make room."""


def room(
    held: Iterable[Held],
    size: int,
    limit: int,
    stored: Mapping[str, int],
    keep: int,
    pinned: Set[SegmentKey] = frozenset(),
) -> Room | None:
    """How a new segment of ``size`` bytes fits under ``limit``; ``None`` if it cannot."""
    held = list(held)
    used = sum(h.size for h in held)
    candidates = droppable(held, stored, keep, pinned)
    reuse = next((h for h in candidates if h.size == size and not h.peer), None)
    if reuse is not None:
        candidates.remove(reuse)
        used -= reuse.size
    drop = []
    for h in candidates:
        if used + size <= limit:
            break
        drop.append(h)
        used -= h.size
    return Room(reuse, drop) if used + size <= limit else None
