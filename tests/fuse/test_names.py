"""Directories the mount holds whole (``fuse/_names.WholeDirs``), a pure core: never
missing a name that is there, as far as the change feed tells."""

from __future__ import annotations

from graben.fuse._names import MAX_DIRS, WholeDirs


def test_a_new_name_in_a_held_directory_is_surely_missing() -> None:
    dirs = WholeDirs()
    dirs.hold("/d", ["a"], dirs.mark())
    assert dirs.lacks("/d/b") and not dirs.lacks("/d/a")
    assert not dirs.lacks("/other/b")  # not held: ask the store
    dirs.added("/d/b")
    assert not dirs.lacks("/d/b")
    dirs.removed("/d/a")
    assert dirs.lacks("/d/a")


def test_a_listing_taken_while_something_changed_elsewhere_is_not_kept() -> None:
    dirs = WholeDirs()
    since = dirs.mark()
    dirs.elsewhere("/x/y", there=True)
    dirs.hold("/d", [], since)
    assert not dirs.lacks("/d/new")


def test_a_write_elsewhere_drops_each_held_directory_on_its_way_that_lacks_it() -> None:
    dirs = WholeDirs()
    for path, names in (("/", ["a"]), ("/a", []), ("/q", [])):
        dirs.hold(path, names, dirs.mark())
    dirs.elsewhere("/a/b/c", there=True)  # /a/b made on the way
    assert not dirs.lacks("/a/b")  # /a dropped: it lacked b
    assert dirs.lacks("/z")  # / had a: still held
    assert dirs.lacks("/q/n")  # elsewhere: untouched
    dirs.elsewhere("/q", there=False)  # /q itself went
    assert not dirs.lacks("/q/n")


def test_a_rename_carries_the_names_and_a_lost_feed_forgets_all() -> None:
    dirs = WholeDirs()
    dirs.hold("/", ["d"], dirs.mark())
    dirs.hold("/d", ["f"], dirs.mark())
    dirs.moved("/d", "/e")
    assert dirs.lacks("/d") and not dirs.lacks("/e")
    assert dirs.lacks("/e/g") and not dirs.lacks("/e/f")
    dirs.clear()
    assert not dirs.lacks("/e/g") and len(dirs) == 0


def test_held_directories_are_bounded() -> None:
    dirs = WholeDirs()
    for i in range(MAX_DIRS + 10):
        dirs.hold(f"/d{i}", [], dirs.mark())
    assert len(dirs) == MAX_DIRS and not dirs.lacks("/d0/x") and dirs.lacks(f"/d{MAX_DIRS}/x")
