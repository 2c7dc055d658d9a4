"""The mount's place in the change feed (``fuse/_follow.Cursor``), a pure core."""

from __future__ import annotations

from graben.fuse._follow import MISSING_MAX, MISSING_S, Cursor
from graben.store import ChangeFeed, PathChange


def _feed(*seqs: int, newest: int = 0, oldest: int = 1) -> ChangeFeed:
    rows = tuple(PathChange(s, f"/p{s}", s, s) for s in seqs)
    return ChangeFeed(rows, newest or max(seqs, default=0), oldest)


def test_the_first_answer_only_places_the_reader_at_the_end() -> None:
    cursor = Cursor()
    assert cursor.request(0.0) == (-1, ())
    assert cursor.advance(_feed(newest=41), 0.0) == ([], False)
    assert cursor.request(0.0) == (41, ())


def test_a_gap_is_asked_for_again_until_it_comes_or_expires() -> None:
    cursor = Cursor(after=10)
    fresh, lost = cursor.advance(_feed(11, 14), 0.0)
    assert [c.seq for c in fresh] == [11, 14] and not lost
    assert cursor.request(1.0)[1] == (12, 13)
    fresh, _ = cursor.advance(_feed(13), 1.0)  # it committed late
    assert [c.seq for c in fresh] == [13]
    assert cursor.request(2.0)[1] == (12,)
    assert cursor.request(MISSING_S + 1)[1] == ()  # rolled back: never to come


def test_nothing_is_given_twice() -> None:
    cursor = Cursor(after=10)
    cursor.advance(_feed(11, 12), 0.0)
    fresh, _ = cursor.advance(_feed(11, 12, 13), 0.0)
    assert [c.seq for c in fresh] == [13]


def test_a_reader_behind_the_oldest_row_kept_has_lost_changes() -> None:
    cursor = Cursor(after=10)
    fresh, lost = cursor.advance(_feed(500, oldest=400), 0.0)
    assert lost and [c.seq for c in fresh] == [500]
    assert cursor.request(0.0)[1] == ()


def test_missing_numbers_are_bounded() -> None:
    cursor = Cursor(after=1)
    cursor.advance(_feed(MISSING_MAX + 100), 0.0)
    assert len(cursor.request(0.0)[1]) == MISSING_MAX
