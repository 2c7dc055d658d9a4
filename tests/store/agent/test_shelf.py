"""What an agent may drop, and how a new segment fits: plain values, no files."""

from __future__ import annotations

from graben.store import Held, SegmentKey
from graben.store.agent._shelf import droppable, room, surplus

MB = 1 << 20
KEY = SegmentKey("j", 9, 0, 2)


def held(
    step: int,
    *,
    rank: int = 0,
    size: int = 10 * MB,
    complete: bool = True,
    peer: bool = False,
    job: str = "j",
    to_store: bool = True,
    order: int = 0,
) -> Held:
    return Held(SegmentKey(job, step, rank, 2), size, complete, peer, to_store, order or step)


def steps(found: list[Held]) -> list[tuple[int, bool]]:
    return [(h.key.step, h.peer) for h in found]


def test_steps_headed_for_the_store_go_only_once_it_holds_them() -> None:
    line = [held(s) for s in (1, 2, 3, 4)]
    assert droppable(line, {}, keep=2) == []  # nothing stored: memory holds the only copies
    assert steps(droppable(line, {"j": 1}, keep=2)) == [(1, False)]
    assert steps(droppable(line, {"j": 4}, keep=2)) == [(1, False), (2, False)]
    assert droppable(line, {"other": 9}, keep=2) == []  # another job's store says nothing


def test_steps_between_the_store_s_are_superseded_beyond_keep() -> None:
    line = [held(1), held(2, to_store=False), held(3, to_store=False), held(4, to_store=False)]
    assert steps(droppable(line, {}, keep=2)) == [(2, False)]  # step 1 waits for the store
    assert steps(droppable(line, {"j": 1}, keep=2)) == [(1, False), (2, False)]


def test_peer_copies_beyond_keep_go_first_and_partial_ones_once_superseded() -> None:
    line = [held(s, peer=True) for s in (1, 2, 3)] + [held(5), held(6, complete=False)]
    line.append(held(4, complete=False))  # a writer that died: step 6 was reserved after it
    assert steps(droppable(line, {"j": 5}, keep=2)) == [(1, True), (4, False)]
    assert held(6, complete=False) not in droppable(line, {"j": 9}, keep=1)  # being written
    restarted = [held(9), held(1, complete=False, order=10)]  # a job begun again from step 1
    assert droppable(restarted, {}, keep=1) == []


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
    fit = room(KEY, line, 10 * MB, 30 * MB, {"j": 3}, keep=1)
    assert fit is not None and fit.reuse == held(1) and fit.drop == []
    fit = room(KEY, line, 20 * MB, 30 * MB, {"j": 3}, keep=1)
    assert fit is not None and fit.reuse is None and fit.drop == [held(1), held(2)]


def test_room_refuses_what_cannot_fit_without_dropping_a_kept_segment() -> None:
    line = [held(1), held(2)]
    assert room(KEY, line, 15 * MB, 30 * MB, {}, keep=2) is None
    assert room(KEY, line, 10 * MB, 30 * MB, {}, keep=2) is not None
    assert room(KEY, [], 31 * MB, 30 * MB, {}, keep=2) is None


def test_under_pressure_a_finished_job_s_stored_steps_make_room() -> None:
    ended = [held(7, job="old", order=1), held(8, job="old", to_store=False, order=2)]
    fit = room(KEY, ended, 15 * MB, 30 * MB, {"old": 7}, keep=2)
    assert fit is not None and fit.drop == [ended[0]]  # step 8 is the only copy: kept
    assert room(KEY, ended, 25 * MB, 30 * MB, {"old": 7}, keep=2) is None


def test_room_reuses_the_same_rank_s_old_segment_first() -> None:
    line = [held(1, rank=1), held(1, rank=0), held(2, rank=0), held(2, rank=1)]
    line += [held(3, rank=0), held(3, rank=1)]
    fit = room(KEY, line, 10 * MB, 60 * MB, {"j": 3}, keep=2)
    assert fit is not None and fit.reuse == held(1, rank=0)
    other = room(SegmentKey("j", 9, 1, 2), line, 10 * MB, 60 * MB, {"j": 3}, keep=2)
    assert other is not None and other.reuse == held(1, rank=1)


def test_the_shelf_keeps_its_bytes_and_each_rank_s_segments_as_it_changes() -> None:
    """Whatever is set, replaced, deleted or popped, the shelf's bytes and each rank's
    segments are what a pass over all of them would find."""
    import random

    from graben.store.agent._segments import Shelf, line_of

    shelf, rng = Shelf(), random.Random(7)
    for _ in range(2000):
        h = held(
            rng.randrange(5),
            rank=rng.randrange(3),
            size=rng.randrange(1, 9) * MB,
            peer=rng.random() < 0.5,
            job=rng.choice("jk"),
        )
        at = (h.key, h.peer)
        move = rng.randrange(4)
        if move < 2:
            shelf[at] = h
        elif move == 2 and at in shelf:
            del shelf[at]
        else:
            shelf.pop(at, None)
        assert shelf.used == sum(x.size for x in shelf.values())
        lines: dict[tuple[str, int, int], set[tuple[SegmentKey, bool]]] = {}
        for where in shelf:
            lines.setdefault(line_of(where[0]), set()).add(where)
        assert {line: set(found) for line, found in shelf.lines.items()} == lines
    assert shelf.line(KEY) and sorted(steps(shelf.line(KEY))) == sorted(
        (h.key.step, h.peer) for h in shelf.values() if line_of(h.key) == line_of(KEY)
    )
