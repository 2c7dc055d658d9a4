"""Pure: which of an agent's segments may be dropped, and what a new one costs.

Rules (``droppable``), per job, rank and world size:

- a complete segment of the rank's own host is kept while it is among the
  newest ``keep`` complete ones; one whose step is headed for the store
  (``to_store``) is kept after that until the store holds its step or a
  newer one (``stored``), so the store's copy is never lost on the way;
  the steps between the store's are superseded by newer ones in memory;
- a peer's copy is kept while it is among the newest ``keep``;
- an incomplete segment is dropped once the same rank reserved another after
  it (its writer died, or moved on), never while it may still be written.

``surplus`` is what an agent drops as soon as it may: all of that but one
spare per rank. ``room`` picks what to drop so a new segment fits under the limit, oldest
first and peers' copies before a host's own (and, if that is not enough,
kept segments whose step the store holds: a finished job's), preferring one the same size
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
        lines[(*_line(h), h.peer)].append(h)
    out: list[Held] = []
    for (job, _, _, peer), line in lines.items():
        line.sort(key=lambda h: h.key.step, reverse=True)
        complete = [h for h in line if h.complete]
        last = max(h.order for h in line)
        out += [h for h in line if not h.complete and h.order < last]
        for h in complete[keep:]:
            if peer or not h.to_store or h.key.step <= stored.get(job, -1):
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
            spares[_line(h)] = h  # oldest first: the newest wins
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
    key: SegmentKey,
    held: Iterable[Held],
    size: int,
    limit: int,
    stored: Mapping[str, int],
    keep: int,
    pinned: Set[SegmentKey] = frozenset(),
) -> Room | None:
    """How ``key``'s new segment of ``size`` bytes fits under ``limit``; ``None`` if not."""
    held = list(held)
    used = sum(h.size for h in held)
    candidates = droppable(held, stored, keep, pinned)
    same = [h for h in candidates if h.size == size and not h.peer]
    # the rank's own old segment first: that rank has it mapped already
    reuse = next((h for h in same if _line(h) == _line_of(key)), same[0] if same else None)
    if reuse is not None:
        candidates.remove(reuse)
        used -= reuse.size
    drop = []
    for h in candidates + _redundant(held, stored, candidates, reuse):
        if used + size <= limit:
            break
        drop.append(h)
        used -= h.size
    return Room(reuse, drop) if used + size <= limit else None


def _redundant(
    held: list[Held], stored: Mapping[str, int], dropped: list[Held], reuse: Held | None
) -> list[Held]:
    """Under pressure, what else may go: complete segments, kept only as the newest of
    their job, whose step the store holds (a job that ended keeps its newest steps in
    memory until another needs the room), the oldest jobs' steps first."""
    gone = {(h.key, h.peer) for h in dropped} | ({(reuse.key, reuse.peer)} if reuse else set())
    extra = [
        h
        for h in held
        if h.complete and (h.key, h.peer) not in gone and h.key.step <= stored.get(h.key.job, -1)
    ]
    return sorted(extra, key=lambda h: (h.order, h.key.step))


def _line(h: Held) -> tuple[str, int, int]:
    return _line_of(h.key)


def _line_of(key: SegmentKey) -> tuple[str, int, int]:
    return (key.job, key.rank, key.world)
