"""The metadata logic over each engine: the same operations, the same outcomes.

Every test here runs twice, on SQLite and on PostgreSQL (``engine`` in
``pg_kit.py``): the namespace logic of ``_namespace.py`` over each
repository, its schema and migrations, damage made behind graben's back,
and what fsck's engine cross-check says of it.
"""

from __future__ import annotations

import pytest
from pg_kit import MIGRATIONS, Engine, chunk, file, names, refs

from graben.store import (
    AlreadyExists,
    DirectoryNotEmpty,
    GrabenError,
    IntegrityError,
    InvalidPath,
    IsADirectory,
    NotADirectory,
    NotFound,
)
from graben.store._types import Change, Extent, FileCommit, NodeState
from graben.store.meta import Metadata
from graben.store.meta._repo import Inode, Tx


@pytest.fixture
def ns(engine: Engine) -> Metadata:
    return Metadata(engine.open())


# -- the store itself ---------------------------------------------------------------------


def test_a_new_store_has_a_root_an_id_and_the_latest_schema(engine: Engine) -> None:
    first = Metadata(engine.open())
    assert first.namespace.stat("/").kind == "directory"
    assert len(first.store_id) == 32 and int(first.store_id, 16)
    assert engine.version() == MIGRATIONS
    again = Metadata(engine.open(create=False))
    assert again.store_id == first.store_id
    assert engine.version() == MIGRATIONS


def test_no_store_is_made_unless_asked(engine: Engine) -> None:
    with pytest.raises(NotFound, match="no graben metadata database here"):
        engine.open(create=False)
    engine.open()  # now it is asked
    assert engine.version() == MIGRATIONS


def test_a_store_from_a_newer_graben_is_refused(engine: Engine) -> None:
    engine.open()
    if engine.name == "sqlite":
        engine.sql(f"PRAGMA user_version = {MIGRATIONS + 1}")
    else:
        engine.sql("UPDATE schema_version SET version = %s", MIGRATIONS + 1)
    with pytest.raises(GrabenError, match="newer than this graben"):
        engine.open(create=False)


def test_a_database_holding_something_else_is_refused(engine: Engine) -> None:
    engine.sql("CREATE TABLE invoices (id INTEGER)")
    with pytest.raises(IntegrityError, match="something else, not a graben store"):
        engine.open()
    assert engine.sql("SELECT COUNT(*) FROM invoices") == [(0,)]


def test_a_failed_transaction_rolls_back_everything(engine: Engine) -> None:
    repo = engine.open()
    made: list[Inode] = []

    def half(tx: Tx) -> None:
        made.append(tx.tree.create(Inode(0, "directory", 0, 0o755, 0, 1, 1)))
        tx.tree.link(1, "half", made[0].id)
        raise RuntimeError("crash mid-transaction")

    with pytest.raises(RuntimeError):
        repo.transact(half)
    with repo.read() as tx:
        assert tx.tree.lookup(1, "half") is None
        assert tx.tree.get(made[0].id) is None


# -- names -----------------------------------------------------------------------------------


def test_directories_give_the_same_outcomes(ns: Metadata) -> None:
    assert ns.namespace.mkdir("/a/b/c", parents=True).path == "/a/b/c"
    with pytest.raises(AlreadyExists):
        ns.namespace.mkdir("/a/b")
    assert ns.namespace.mkdir("/a/b", exist_ok=True).kind == "directory"
    with pytest.raises(NotFound):
        ns.namespace.mkdir("/x/y")
    ns.commits.commit((file("/a/f", [chunk(1)]),))
    with pytest.raises(NotADirectory):
        ns.namespace.mkdir("/a/f/g", parents=True)
    with pytest.raises(DirectoryNotEmpty):
        ns.namespace.remove("/a")
    assert [e.path for e in ns.namespace.listdir("/a/f").entries] == [
        "/a/f"
    ]  # a file lists as itself
    assert ns.quotas.usage("/") == (1, 1000)
    assert ns.namespace.remove("/a", recursive=True) == 4  # a, b, c and f
    assert ns.namespace.listdir("/").entries == []
    with pytest.raises(InvalidPath):
        ns.namespace.remove("/")


def test_renames_give_the_same_outcomes(ns: Metadata) -> None:
    ns.commits.commit((file("/d/one", [chunk(1)]), file("/d/two", [chunk(2)])))
    ns.namespace.mkdir("/e/sub", parents=True)
    moved = ns.namespace.rename("/d/one", "/d/two")  # os.replace: the old /d/two goes
    assert (moved.path, moved.size) == ("/d/two", 1000)
    assert names(ns, "/d") == ["two"]
    ns.commits.commit((file("/e/two", [chunk(3)]),))
    with pytest.raises(AlreadyExists):
        ns.namespace.rename("/d/two", "/e/two", replace=False)
    with pytest.raises(IsADirectory):
        ns.namespace.rename("/d/two", "/e/sub")
    with pytest.raises(NotADirectory):
        ns.namespace.rename("/e/sub", "/d/two")
    with pytest.raises(InvalidPath, match="into itself"):
        ns.namespace.rename("/e", "/e/sub/inner")
    ns.namespace.rename("/e", "/moved/e")  # a whole tree, parents made on the way
    assert names(ns, "/moved/e") == ["sub", "two"]
    with pytest.raises(NotFound):
        ns.namespace.stat("/e")
    with pytest.raises(DirectoryNotEmpty):
        ns.namespace.rename("/d", "/moved/e")
    ns.namespace.rename("/d", "/moved/e", replace_tree=True)
    assert names(ns, "/moved/e") == ["two"]
    assert ns.records.check_metadata() == []


def test_listings_sort_by_code_point_and_pages_agree(ns: Metadata) -> None:
    wanted = ["b", "B", "a", "é", "Z", "_x", "10", "9", "ä", "日本", "a b", "A", "~"]
    for name in wanted:
        ns.namespace.mkdir(f"/d/{name}", parents=True)
    seen: list[str] = []
    page = ns.namespace.listdir("/d", limit=3)
    while True:
        seen += [e.path.rsplit("/", 1)[1] for e in page.entries]
        if not page.more:
            break
        page = ns.namespace.listdir("/d", seen[-1], 3, page.directory)
    assert seen == sorted(wanted)  # Python's order: code points, as SQLite's BINARY


def test_attributes_change_in_place(ns: Metadata) -> None:
    ns.commits.commit((file("/f", [chunk(1)]),))
    changed = ns.namespace.set_attributes("/f", Change(mode=0o600, mtime_ns=12345))
    assert (changed.mode, changed.mtime_ns, changed.generation) == (0o600, 12345, 1)
    assert ns.namespace.stat("/f").mode == 0o600


# -- files and chunks ---------------------------------------------------------------------------


def test_commits_count_references_and_overwrites_release_them(engine: Engine) -> None:
    ns = Metadata(engine.open())
    shared, a, b = chunk(1), chunk(2), chunk(3)
    first = ns.commits.commit((file("/f", [shared, a, shared]),))[0]
    assert (first.size, first.generation) == (3000, 1)
    assert (refs(engine, shared), refs(engine, a)) == (2, 1)
    layout = ns.namespace.layout("/f")
    assert [x.chunk.id for x in layout.extents] == [shared.id, a.id, shared.id]
    assert layout.replicas == {shared.id: ("n1",), a.id: ("n1",)}
    ns.commits.commit((file("/g", [shared]),))
    second = ns.commits.commit((file("/f", [b]),))[0]
    assert second.generation == 2
    assert (refs(engine, shared), refs(engine, a), refs(engine, b)) == (1, 0, 1)
    assert ns.records.check_metadata() == []
    assert [c for c, _, _ in ns.records.collectable(0)] == [a.id]  # the one chunk no file uses
    assert ns.records.collectable(0) == []
    ns.namespace.remove("/g")
    assert ns.records.check_metadata() == []


def test_exclusive_commits_and_unknown_chunks_are_refused(ns: Metadata) -> None:
    ns.commits.commit((file("/f", [chunk(1)]),))
    with pytest.raises(AlreadyExists):
        ns.commits.commit((file("/f", [chunk(2)], mode="create"),))
    missing = FileCommit("/g", (Extent(0, 1000, chunk(9), 0),))  # no stored chunk either
    with pytest.raises(IntegrityError, match="does not hold"):
        ns.commits.commit((missing,))
    with pytest.raises(IsADirectory):
        ns.commits.commit((file("/", [chunk(1)]),))
    assert names(ns, "/") == ["f"]


def test_a_commit_group_keeps_each_batch_whole(ns: Metadata) -> None:
    ns.commits.commit((file("/taken", [chunk(1)]),))
    results = ns.commits.commit_group(
        [
            (file("/a", [chunk(2)]),),
            (file("/b", [chunk(3)]), file("/taken", [chunk(4)], mode="create")),
            (file("/c", [chunk(5)]),),
        ]
    )
    assert isinstance(results[1], AlreadyExists)
    assert [r[0].path for r in (results[0], results[2]) if isinstance(r, list)] == ["/a", "/c"]
    assert names(ns, "/") == ["a", "c", "taken"]  # /b went with its batch
    assert ns.records.check_metadata() == []


def test_a_failed_batch_takes_its_new_directories_with_it(ns: Metadata) -> None:
    ns.commits.commit((file("/taken", [chunk(1)]),))
    results = ns.commits.commit_group(
        [
            (file("/d/e/a", [chunk(2)]), file("/taken", [chunk(3)], mode="create")),
            (file("/d/e/b", [chunk(4)]),),  # its directories are made again, not remembered
        ]
    )
    assert isinstance(results[0], AlreadyExists)
    assert isinstance(results[1], list)
    assert names(ns, "/d/e") == ["b"]
    assert ns.records.check_metadata() == []


def test_pages_of_extents_and_chunks(engine: Engine) -> None:
    ns = Metadata(engine.open())
    chunks = [chunk(i) for i in range(10)]
    ns.commits.commit((file("/big", chunks),))
    ns.commits.commit((file("/other", chunks[:2]),))
    with engine.open().read() as tx:
        node = tx.tree.lookup(1, "big")
        assert node is not None
        page = tx.files.extents_page(node.id, 2500, 3)  # from the extent covering 2500
        assert [x.offset for x in page] == [2000, 3000, 4000]
        assert len(tx.files.extents(node.id)) == 10
        assert tx.files.chunk_users(chunks[0].id, 0, 10) == sorted(
            i.id for i in (node, tx.tree.lookup(1, "other")) if i is not None
        )
        assert tx.tree.path_of(node.id) == "/big"
    seen, after = [], ""
    while True:
        page_ = ns.records.chunk_refs(after, 3)
        seen += [c.id for c, _ in page_.chunks]
        if not page_.after:
            break
        after = page_.after
    assert seen == sorted(c.id for c in chunks)


def test_nodes_heartbeats_and_repair_bookkeeping(ns: Metadata) -> None:
    for i in (1, 2, 3):
        ns.nodes.heartbeat(NodeState(f"n{i}", f"127.0.0.1:{9000 + i}", f"rack{i}", 10, 20))
    assert [(n.id, n.alive) for n in ns.nodes.listed()] == [
        ("n1", True),
        ("n2", True),
        ("n3", True),
    ]
    c = chunk(1)
    ns.commits.commit((file("/f", [c], nodes=("n2", "n1"), replication=3),))
    short = ns.records.degraded()
    assert [(d.chunk.id, d.live, d.want) for d in short] == [(c.id, ("n1", "n2"), 3)]
    ns.records.record_copies({c.id: ("n3",)})
    assert ns.records.degraded() == []
    ns.records.report_bad(c.id, "n2", "crc mismatch")
    assert [d.live for d in ns.records.degraded()] == [("n1", "n3")]
    assert ns.nodes.health().degraded == 1


# -- damage made behind graben's back ---------------------------------------------------------


@pytest.fixture
def damaged(engine: Engine) -> Metadata:
    """A store of five files in /d, each of three chunks, ready to be damaged."""
    ns = Metadata(engine.open())
    for i in range(5):
        ns.commits.commit((file(f"/d/file-{i}", [chunk(10 * i + j) for j in range(3)]),))
    assert ns.records.check_metadata() == []
    return ns


def _details(ns: Metadata) -> str:
    return " / ".join(p.detail for p in ns.records.check_metadata())


def test_an_extent_naming_a_chunk_the_store_lacks(engine: Engine, damaged: Metadata) -> None:
    engine.sql("UPDATE extents SET chunk = %s WHERE chunk = %s", "f" * 64, chunk(21).id)
    with pytest.raises(IntegrityError, match=r"chunk row.*/d/file-2"):
        damaged.namespace.layout("/d/file-2")
    assert damaged.namespace.layout("/d/file-1").info.size == 3000
    details = _details(damaged)
    assert "no chunk row" in details and "refs" in details


def test_a_changed_file_size_is_found(engine: Engine, damaged: Metadata) -> None:
    engine.sql(
        "UPDATE inodes SET size = size + 16384 WHERE size = 3000 AND id = "
        "(SELECT inode FROM entries WHERE name = 'file-0')"
    )
    with damaged.repo.read() as tx:
        node = tx.tree.lookup(tx.tree.lookup(1, "d").id, "file-0")  # type: ignore[union-attr]
        assert node is not None
        with pytest.raises(IntegrityError, match=r"size.*/d/file-0"):
            tx.files.extents(node.id)
    assert "size is 19384" in _details(damaged)


def test_an_entry_naming_a_missing_inode_is_found(engine: Engine, damaged: Metadata) -> None:
    engine.sql("UPDATE entries SET inode = 999999 WHERE name = 'file-2'")  # sum made anew
    for look in (lambda: names(damaged, "/d"), lambda: damaged.namespace.stat("/d/file-2")):
        with pytest.raises(IntegrityError, match="names inode 999999, which does not exist"):
            look()  # never a listing that leaves it out, nor "no such file"
    details = _details(damaged)
    assert "/d/file-2" in details  # fsck names it
    assert "no entry" in details  # and the inode nobody names


def test_a_wrong_reference_count_is_found_and_never_collected(
    engine: Engine, damaged: Metadata
) -> None:
    engine.sql("UPDATE chunks SET refs = 0 WHERE id = %s", chunk(31).id)
    assert "counts 0 refs but 1" in _details(damaged)
    assert damaged.records.collectable(0) == []  # an extent still names it
    assert damaged.namespace.layout("/d/file-3").info.size == 3000


def test_a_row_that_does_not_decode_is_found(engine: Engine, damaged: Metadata) -> None:
    engine.sql("UPDATE chunks SET id = %s WHERE id = %s", "not-a-chunk-id", chunk(41).id)
    assert "does not decode" in _details(damaged)
    listed = [c.id for c, _ in damaged.records.chunk_refs("", 1000).chunks]
    assert len(listed) == 14 and "not-a-chunk-id" not in listed
