"""Directories the mount holds whole (``fuse/_names.WholeDirs``), a pure core: never
missing a name that is there, as far as the change feed tells."""

from __future__ import annotations

from graben.fuse._names import MAX_DIRS, MAX_LISTED, Listings, WholeDirs


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


# -- listings kept (``Listings``) ---------------------------------------------------------


def _kept(dirs: WholeDirs, *paths: str) -> list[str]:
    for path in paths:
        dirs.listings.keep(path, [f"{path} listed"], dirs.listings.mark())
    return [p for p in paths if dirs.listings.get(p) is not None]


def test_a_change_here_lets_go_of_the_listings_that_show_it() -> None:
    """A name made in /a/b changes /a/b's listing, /a/b's attributes (in /a's listing)
    and nothing above: / and a sibling stay kept."""
    dirs = WholeDirs()
    tree = ("/", "/a", "/a/b", "/a/b/c", "/a/side")
    assert _kept(dirs, *tree) == list(tree)
    dirs.added("/a/b/new")
    assert [p for p in tree if dirs.listings.get(p) is not None] == ["/", "/a/b/c", "/a/side"]
    assert _kept(dirs, "/a", "/a/b") == ["/a", "/a/b"]  # listed again after the change
    dirs.listings.touch("/a/side/f")  # an attribute changed: a chmod, a commit
    assert dirs.listings.get("/a/side") is None and dirs.listings.get("/a") is None
    assert dirs.listings.get("/a/b") == ["/a/b listed"]


def test_renames_and_removals_here_let_go_of_both_sides() -> None:
    dirs = WholeDirs()
    _kept(dirs, "/x", "/y", "/y/sub")
    dirs.moved("/x/f", "/y/g")
    assert dirs.listings.get("/x") is None and dirs.listings.get("/y") is None
    assert dirs.listings.get("/y/sub") == ["/y/sub listed"]
    dirs.removed("/y/sub")
    assert dirs.listings.get("/y/sub") is None


def test_a_change_elsewhere_or_a_lost_feed_lets_go_of_every_listing() -> None:
    dirs = WholeDirs()
    _kept(dirs, "/p", "/q")
    dirs.elsewhere("/far/away", there=False)
    assert dirs.listings.get("/p") is None and dirs.listings.get("/q") is None
    _kept(dirs, "/p")
    dirs.clear()
    assert dirs.listings.get("/p") is None


def test_a_listing_read_while_anything_changed_is_not_kept() -> None:
    listings: Listings[str] = Listings()
    since = listings.mark()
    listings.touch("/elsewhere/entirely")
    listings.keep("/d", ["stale?"], since)
    assert listings.get("/d") is None


def test_listings_kept_are_bounded_by_their_entries() -> None:
    listings: Listings[int] = Listings()
    half = MAX_LISTED // 2
    for name in ("/one", "/two", "/three"):
        listings.keep(name, list(range(half)), listings.mark())
    assert listings.get("/one") is None  # the oldest went
    assert listings.get("/two") is not None and listings.get("/three") is not None
    listings.keep("/huge", list(range(MAX_LISTED + 1)), listings.mark())
    assert listings.get("/huge") is None
