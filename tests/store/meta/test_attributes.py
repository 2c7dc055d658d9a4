"""What a file system keeps beyond bytes, on each engine: owners, change and access
times, link counts, hard links, fifos and device nodes, directory times, and the
schema migration that added them to stores made before (issue 17)."""

from __future__ import annotations

import stat
import time

import pytest
from pg_kit import MIGRATIONS, Engine, chunk, file, refs

from graben.store import AlreadyExists, InvalidArgument, IsADirectory, NameTooLong, NotFound
from graben.store._types import Change
from graben.store.meta import Metadata


@pytest.fixture
def ns(engine: Engine) -> Metadata:
    return Metadata(engine.open())


def test_owners_and_times_are_kept_and_the_ctime_follows_each_change(ns: Metadata) -> None:
    [made] = ns.commits.commit((file("/f", [chunk(1)], uid=1000, gid=100, mtime_ns=5),))
    assert (made.uid, made.gid, made.mtime_ns) == (1000, 100, 5)
    assert made.ctime_ns > 5 and made.nlink == 1
    changed = ns.namespace.set_attributes("/f", Change(uid=0, atime_ns=7))
    assert (changed.uid, changed.gid, changed.atime_ns, changed.mtime_ns) == (0, 100, 7, 5)
    assert changed.ctime_ns >= made.ctime_ns
    assert ns.namespace.stat("/f") == changed
    # A new version keeps the owner and mode it replaces unless it sets its own.
    ns.namespace.set_attributes("/f", Change(mode=0o600))
    [again] = ns.commits.commit((file("/f", [chunk(2)]),))
    assert (again.uid, again.gid, again.mode) == (0, 100, 0o600)
    # Mode 0 is a mode, not "unset".
    [locked] = ns.commits.commit((file("/locked", [], permissions=0),))
    assert locked.mode == 0
    # Files from other clients have no owner recorded.
    [plain] = ns.commits.commit((file("/plain", [chunk(3)]),))
    assert (plain.uid, plain.gid, plain.nlink) == (-1, -1, 1)


def test_values_out_of_range_are_refused_and_change_nothing(ns: Metadata) -> None:
    ns.commits.commit((file("/f", [chunk(1)]),))
    before = ns.namespace.stat("/f")
    for bad in (
        Change(mtime_ns=2**63),
        Change(atime_ns=-(2**63) - 1),
        Change(uid=2**32),
        Change(mode=0o10000),
    ):
        with pytest.raises(InvalidArgument):
            ns.namespace.set_attributes("/f", bad)
    with pytest.raises(InvalidArgument, match="no bytes"):
        ns.commits.commit((file("/fifo", [chunk(2)], permissions=stat.S_IFIFO | 0o644),))
    with pytest.raises(InvalidArgument):
        ns.commits.commit((file("/dir", [], permissions=stat.S_IFDIR | 0o755),))
    assert ns.namespace.stat("/f") == before
    with pytest.raises(NameTooLong):
        ns.namespace.stat("/" + "n" * 256)


def test_hard_links_share_one_file_until_the_last_name_goes(engine: Engine, ns: Metadata) -> None:
    one = chunk(1)
    ns.commits.commit((file("/a", [one]),))
    ns.namespace.mkdir("/d")
    linked = ns.namespace.link("/a", "/d/b")
    assert linked.nlink == 2 and linked.inode == ns.namespace.stat("/a").inode
    assert ns.namespace.stat("/a").nlink == 2
    # A new version written at either name is what both show.
    [new] = ns.commits.commit((file("/d/b", [chunk(2)]),))
    assert ns.namespace.stat("/a").inode == new.inode and ns.namespace.stat("/a").nlink == 2
    assert refs(engine, one) == 0
    with pytest.raises(AlreadyExists):
        ns.namespace.link("/a", "/d/b")
    with pytest.raises(IsADirectory):
        ns.namespace.link("/d", "/d2")
    with pytest.raises(NotFound):
        ns.namespace.link("/a", "/missing/c")  # a link's directory is not made for it
    # Renaming one name onto another of the same file changes nothing (POSIX).
    assert ns.namespace.rename("/a", "/d/b").path == "/d/b"
    assert ns.namespace.stat("/a").nlink == 2
    assert ns.namespace.remove("/a") == 1  # a name went; the file stays: another leads to it
    assert ns.namespace.stat("/d/b").nlink == 1
    assert refs(engine, chunk(2)) == 1
    ns.namespace.link("/d/b", "/c")
    ns.namespace.link("/d/b", "/d/e")
    assert ns.namespace.remove("/d", recursive=True) == 3  # three names; the file keeps /c
    assert ns.namespace.stat("/c").nlink == 1 and refs(engine, chunk(2)) == 1
    ns.commits.commit((file("/x", [chunk(3)]),))
    assert ns.namespace.rename("/x", "/c").path == "/c"  # replacing its last name frees it
    assert refs(engine, chunk(2)) == 0


def test_directories_count_subdirectories_and_change_with_their_entries(
    ns: Metadata,
) -> None:
    top = ns.namespace.mkdir("/top", mode=0o750, uid=5, gid=6)
    assert (top.mode, top.uid, top.gid, top.nlink) == (0o750, 5, 6, 2)

    def changed(step: object) -> None:
        before = ns.namespace.stat("/top")
        time.sleep(0.002)
        assert callable(step)
        step()
        after = ns.namespace.stat("/top")
        assert after.mtime_ns > before.mtime_ns and after.ctime_ns > before.ctime_ns

    changed(lambda: ns.namespace.mkdir("/top/a"))
    changed(lambda: ns.commits.commit((file("/top/b/deep", [chunk(1)]),)))  # makes /top/b
    assert ns.namespace.stat("/top").nlink == 4
    changed(lambda: ns.commits.commit((file("/top/f", [chunk(2)]),)))
    changed(lambda: ns.namespace.rename("/top/f", "/top/g"))
    changed(lambda: ns.namespace.rename("/top/a", "/elsewhere"))
    assert ns.namespace.stat("/top").nlink == 3 and ns.namespace.stat("/").nlink >= 4
    changed(lambda: ns.namespace.remove("/top/b", recursive=True))
    changed(lambda: ns.namespace.link("/top/g", "/top/h"))
    changed(lambda: ns.commits.commit((file("/top/p", [], permissions=stat.S_IFIFO | 0o600),)))
    assert ns.namespace.stat("/top").nlink == 2
    before = ns.namespace.stat("/top")
    ns.commits.commit((file("/top/g", [chunk(3)]),))  # a new version of a name it has
    assert ns.namespace.stat("/top").mtime_ns == before.mtime_ns


def test_special_files_are_names_with_attributes(ns: Metadata) -> None:
    [node] = ns.commits.commit(
        (file("/null", [], permissions=stat.S_IFCHR | 0o666, rdev=(1 << 8) | 3),)
    )
    assert stat.S_ISCHR(node.mode) and node.rdev == 259 and node.size == 0
    ns.namespace.set_attributes("/null", Change(mode=0o600))
    assert ns.namespace.stat("/null").mode == stat.S_IFCHR | 0o600  # chmod keeps the type


def test_stores_made_before_get_link_counts_and_change_times(engine: Engine) -> None:
    """A store of schema 5 (no owners, no link counts) opened by this graben."""
    ns = Metadata(engine.open())
    ns.commits.commit((file("/a/b/f", [chunk(1)]),))
    ns.namespace.mkdir("/a/c")
    engine.back_to_7()
    for column in ("uid", "gid", "ctime_ns", "atime_ns", "nlink", "rdev"):
        engine.sql(f"ALTER TABLE inodes DROP COLUMN {column}")
    engine.sql("DROP TABLE chunk_bytes")  # schema 7's
    engine.set_version(5)
    migrated = Metadata(engine.open(create=False))
    assert engine.version() == MIGRATIONS
    assert migrated.namespace.stat("/a").nlink == 4
    assert migrated.namespace.stat("/a/b").nlink == 2
    f = migrated.namespace.stat("/a/b/f")
    assert (f.nlink, f.uid, f.ctime_ns, f.atime_ns) == (1, -1, f.mtime_ns, f.mtime_ns)


def test_the_roots_mode_owner_and_times_change_like_any_directorys(ns: Metadata) -> None:
    # rsync -a src/ mnt/ and tar's "./" entry set the mount's root (was InvalidArgument)
    before = ns.namespace.stat("/")
    after = ns.namespace.set_attributes("/", Change(mode=0o1777, uid=1000, gid=100, mtime_ns=5))
    assert after.kind == "directory" and stat.S_IMODE(after.mode) == 0o1777
    assert (after.uid, after.gid, after.mtime_ns) == (1000, 100, 5)
    assert after.ctime_ns >= before.ctime_ns
    assert ns.namespace.stat("/") == after


def test_a_new_stores_root_is_dated_when_it_was_made(engine: Engine) -> None:
    made = time.time_ns()
    root = Metadata(engine.open()).namespace.stat("/")
    for when in (root.mtime_ns, root.ctime_ns, root.atime_ns):
        assert made - 5 * 10**9 <= when <= time.time_ns(), root  # not 1970
