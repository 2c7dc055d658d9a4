"""What an agent may drop, and how a new segment fits: plain values, no files."""

from __future__ import annotations

from graben.store import Held, SegmentKey
from graben.store.agent._shelf import droppable, room, surplus

MB = 1 << 20


def held(
    step: int,
    *,
    rank: int = 0,
    size: int = 10 * MB,
    complete: bool = True,
    peer: bool = False,
    job: str = "j",
) -> Held:
    return Held(SegmentKey(job, step, rank, 2), size, complete, peer)


def steps(found: list[Held]) -> list[tuple[int, bool]]:
    return [(h.key.step, h.peer) for h in found]


def test_own_segments_beyond_keep_go_only_once_the_store_holds_them() -> None:
    line = [held(s) for s in (1, 2, 3, 4)]
    assert droppable(line, {}, keep=2) == []  # nothing stored: memory holds the only copies
    assert steps(droppable(line, {"j": 1}, keep=2)) == [(1, False)]
    assert steps(droppable(line, {"j": 4}, keep=2)) == [(1, False), (2, False)]
    assert droppable(line, {"other": 9}, keep=2) == []  # another job's store says nothing


def test_peer_copies_beyond_keep_go_first_and_partial_ones_once_superseded() -> None:
    line = [held(s, peer=True) for s in (1, 2, 3)] + [held(5), held(6, complete=False)]
    line.append(held(4, complete=False))  # a writer that died: step 6 came after it
    assert steps(droppable(line, {"j": 5}, keep=2)) == [(1, True), (4, False)]
    assert held(6, complete=False) not in droppable(line, {"j": 9}, keep=1)  # being written


def test_pinned_segments_are_never_dropped() -> None:
    line = [held(s) for s in (1, 2, 3)]
    pinned = {held(1).key}
    assert droppable(line, {"j": 3}, keep=1, pinned=pinned) == [held(2)]


def test_surplus_keeps_one_spare_per_rank_for_its_next_save() -> None:
    line = [held(s, rank=r) for s in (1, 2, 3, 4) for r in (0, 1)]
    gone = surplus(line, {"j": 4}, keep=1)
    assert sorted((h.key.step, h.key.rank) for h in gone) == [(1, 0), (1, 1), (2, 0), (2, 1)]


def test_room_reuses_a_spare_of_the_same_size_and_drops_oldest_first() -> None:
    line = [held(1), held(2), held(3, size=5 * MB)]
    fit = room(line, 10 * MB, 30 * MB, {"j": 3}, keep=1)
    assert fit is not None and fit.reuse == held(1) and fit.drop == []
    fit = room(line, 20 * MB, 30 * MB, {"j": 3}, keep=1)
    assert fit is not None and fit.reuse is None and fit.drop == [held(1), held(2)]


def test_room_refuses_what_cannot_fit_without_dropping_a_kept_segment() -> None:
    line = [held(1), held(2)]
    assert room(line, 15 * MB, 30 * MB, {}, keep=2) is None
    assert room(line, 10 * MB, 30 * MB, {}, keep=2) is not None
    assert room([], 31 * MB, 30 * MB, {}, keep=2) is None
