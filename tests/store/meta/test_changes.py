"""The change feed, on both engines: every write names the paths it changed, in the
same transaction, and a reader that keeps the numbers it has not seen yet misses
nothing, even when a transaction that took its number first commits last."""

from __future__ import annotations

import threading
import time

from pg_kit import Engine, chunk, file

from graben.fuse._follow import Cursor
from graben.store import GrabenError
from graben.store._types import Change
from graben.store.meta import Metadata
from graben.store.meta._changes import KEPT_S
from graben.store.transport import Changes, PathChange


def _feed(ns: Metadata, cursor: Cursor) -> list[PathChange]:
    fresh, lost = cursor.advance(
        ns.execute(Changes(*cursor.request(time.monotonic()))), time.monotonic()
    )
    assert not lost
    return fresh


def _rows(changes: list[PathChange]) -> list[tuple[str, bool]]:
    """Each change's path, and whether a name is there after it."""
    return [(c.path, c.inode != 0) for c in changes]


def test_every_kind_of_write_names_what_it_changed(engine: Engine) -> None:
    ns = Metadata(engine.open())
    cursor = Cursor()
    assert _feed(ns, cursor) == []  # the first answer says where the feed is
    ns.commits.commit((file("/a/f", [chunk(1)]), file("/a/g", [chunk(2)])))
    made = ns.namespace.mkdir("/d")
    ns.namespace.rename("/a/f", "/d/f")
    ns.namespace.link("/a/g", "/d/g")
    attrs = ns.namespace.set_attributes("/a/g", Change(mode=0o600))
    ns.namespace.remove("/d", recursive=True)
    changes = _feed(ns, cursor)
    assert _rows(changes) == [
        ("/a/f", True),
        ("/a/g", True),
        ("/d", True),
        ("/a/f", False),
        ("/d/f", True),
        ("/a/g", True),
        ("/d/g", True),
        ("/a/g", True),
        ("/d", False),
    ]
    assert [c.seq for c in changes] == sorted(c.seq for c in changes)
    assert (changes[2].inode, changes[2].ctime_ns) == (made.inode, made.ctime_ns)
    assert (changes[7].inode, changes[7].ctime_ns) == (attrs.inode, attrs.ctime_ns)
    assert _feed(ns, cursor) == []  # nothing twice


def test_a_write_that_fails_names_nothing(engine: Engine) -> None:
    ns = Metadata(engine.open())
    cursor = Cursor()
    _feed(ns, cursor)
    ns.namespace.mkdir("/d")
    try:
        ns.commits.commit((file("/ok", [chunk(1)]), file("/d", [chunk(2)])))  # /d is a directory
    except GrabenError:
        pass
    else:
        raise AssertionError("a file over a directory was committed")
    assert _rows(_feed(ns, cursor)) == [("/d", True)]


def test_a_number_taken_first_and_committed_last_is_not_missed(engine: Engine) -> None:
    """The writer that took its number first commits after another: a reader that asked
    between the two sees the later number first, and the earlier one when it asks again."""
    repo = engine.open()
    ns = Metadata(repo)
    cursor = Cursor()
    _feed(ns, cursor)
    numbered, release = threading.Event(), threading.Event()

    def slow(tx: object) -> None:
        tx.feed.record_changes([("/slow", 7, 7)], time.time_ns())  # type: ignore[attr-defined]
        numbered.set()
        assert release.wait(30)

    slow_writer = threading.Thread(target=repo.transact, args=(slow,))
    slow_writer.start()
    assert numbered.wait(30)
    if engine.name == "postgresql":  # SQLite has one writer: the next waits for this one
        ns.commits.commit((file("/fast", [chunk(1)]),))
        assert _rows(_feed(ns, cursor)) == [("/fast", True)]
        assert cursor.missing  # the slow one's number, below the last seen
    release.set()
    slow_writer.join(30)
    if engine.name != "postgresql":
        ns.commits.commit((file("/fast", [chunk(1)]),))
    got = sorted(c.path for c in _feed(ns, cursor))
    assert got == (["/slow"] if engine.name == "postgresql" else ["/fast", "/slow"])
    assert not cursor.missing


def test_a_reader_behind_the_rows_kept_is_told_it_missed_some(engine: Engine) -> None:
    repo = engine.open()
    ns = Metadata(repo)
    cursor = Cursor()
    _feed(ns, cursor)
    ns.namespace.mkdir("/a")
    assert _feed(ns, cursor)
    for i in range(3):
        ns.namespace.mkdir(f"/b{i}")
    repo.transact(lambda tx: tx.feed.forget_changes(time.time_ns() + 1, 100))  # all of them go
    ns.namespace.mkdir("/c")
    feed = ns.execute(Changes(*cursor.request(time.monotonic())))
    fresh, lost = cursor.advance(feed, time.monotonic())
    assert lost and [c.path for c in fresh] == ["/c"]
    assert _feed(ns, Cursor()) == []  # a new reader starts at the end


def test_old_rows_are_pruned_as_writes_go_on(engine: Engine) -> None:
    repo = engine.open()
    ns = Metadata(repo)
    repo.transact(lambda tx: tx.feed.record_changes([("/old", 0, 0)] * 50, 1))  # made long ago
    for i in range(200):  # a write prunes one time in PRUNE_ONE_IN
        ns.namespace.mkdir(f"/d{i}")
    oldest, newest = ns.execute(Changes(-1)).oldest, ns.execute(Changes(-1)).newest
    assert oldest > 50 and newest == 250
    assert KEPT_S >= 60  # past any kernel cache a mount keeps by default
