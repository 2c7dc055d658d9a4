"""Writers of two services racing on one directory leave a state some serial order would.

Each test runs on SQLite (two repositories on one file: its single writer
serialises them) and on PostgreSQL (two repositories on one database, as two
metadata services; writers commit side by side there, kept apart by row
locks and run again on a conflict). Threads start together at a barrier;
what they are told, and what the store holds after, must be what one order
of the same operations would give: one winner of an exclusive create or of
a rename, no directory inside itself, link counts and reference counts that
match the names and extents (fsck's cross-checks).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from pg_kit import Engine, chunk, file, names

from graben.store import AlreadyExists, GrabenError, InvalidPath, NotFound
from graben.store.meta import Metadata

THREADS = 8


@pytest.fixture(name="services")
def services_fixture(engine: Engine) -> list[Metadata]:
    """Two namespaces on one store, as two metadata services would run."""
    return [Metadata(engine.open()) for _ in range(2)]


def race(services: list[Metadata], work: Callable[[Metadata, int], Any]) -> list[Any]:
    """``work(service, i)`` on ``THREADS`` threads started together, alternating services;
    each one's result, or the ``GrabenError`` it raised."""
    start = threading.Barrier(THREADS)

    def one(i: int) -> Any:
        start.wait()
        try:
            return work(services[i % 2], i)
        except GrabenError as exc:
            return exc

    with ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(one, range(THREADS)))


def consistent(ns: Metadata, engine: Engine) -> None:
    """fsck's cross-checks pass, and every link count is what the names say."""
    assert ns.records.check_metadata() == []
    files = engine.sql(
        "SELECT i.id, i.nlink, (SELECT COUNT(*) FROM entries e WHERE e.inode = i.id) "
        "FROM inodes i WHERE i.kind = 'file'"
    )
    assert [(inode, links) for inode, links, named in files if links != named] == []
    dirs = engine.sql(
        "SELECT i.id, i.nlink, 2 + (SELECT COUNT(*) FROM entries e JOIN inodes c "
        "ON c.id = e.inode WHERE e.parent = i.id AND c.kind = 'directory') "
        "FROM inodes i WHERE i.kind = 'directory'"
    )
    assert [(inode, links) for inode, links, want in dirs if links != want] == []


def test_one_exclusive_create_wins(services: list[Metadata], engine: Engine) -> None:
    for round_ in range(5):
        path = f"/d/f{round_}"
        results = race(
            services, lambda ns, i, p=path: ns.commits.commit((file(p, [chunk(i)], mode="create"),))
        )
        won = [r for r in results if not isinstance(r, GrabenError)]
        assert len(won) == 1, results
        assert all(isinstance(r, AlreadyExists) for r in results if r not in won)
        assert services[0].namespace.stat(path).size == 1000
    assert names(services[1], "/d") == [f"f{r}" for r in range(5)]
    consistent(services[0], engine)


def test_replacing_one_path_together_keeps_one_version(
    services: list[Metadata], engine: Engine
) -> None:
    results = race(
        services, lambda ns, i: ns.commits.commit((file("/d/f", [chunk(i), chunk(99)]),))
    )
    assert not [r for r in results if isinstance(r, GrabenError)]
    assert sorted(r[0].generation for r in results) == list(range(1, THREADS + 1))
    assert names(services[0], "/d") == ["f"]
    # One version holds its chunks: the others' references were all released.
    used = engine.sql("SELECT COUNT(*) FROM chunks WHERE refs > 0")[0][0]
    assert used == 2
    consistent(services[0], engine)


def test_one_rename_of_a_name_wins(services: list[Metadata], engine: Engine) -> None:
    services[0].commits.commit((file("/d/src", [chunk(1)]),))
    results = race(services, lambda ns, i: ns.namespace.rename("/d/src", f"/d/dst{i}"))
    won = [i for i, r in enumerate(results) if not isinstance(r, GrabenError)]
    assert len(won) == 1, results
    assert all(isinstance(r, NotFound) for i, r in enumerate(results) if i not in won)
    assert names(services[1], "/d") == [f"dst{won[0]}"]
    consistent(services[0], engine)


def test_crossed_directory_moves_never_make_a_cycle(
    services: list[Metadata], engine: Engine
) -> None:
    for round_ in range(6):
        for d in ("a", "b"):
            services[0].namespace.mkdir(f"/r{round_}/{d}", parents=True)

        def move(ns: Metadata, i: int, r: int = round_) -> Any:
            src, dst = ("a", "b") if i % 2 else ("b", "a")
            return ns.namespace.rename(f"/r{r}/{src}", f"/r{r}/{dst}/{src}")  # makes a missing dst

        results = race(services, move)
        assert all(isinstance(r, (NotFound, InvalidPath)) for r in results if _failed(r))
        consistent(services[0], engine)
        assert (
            reachable(services[0])
            == engine.sql("SELECT COUNT(*) FROM inodes WHERE kind = 'directory'")[0][0]
        )


def _failed(result: Any) -> bool:
    return isinstance(result, GrabenError)


def reachable(ns: Metadata) -> int:
    """Directories reachable from the root (a cycle cut off from it would not be)."""
    found, pending = 0, ["/"]
    while pending:
        path = pending.pop()
        found += 1
        listing = ns.namespace.listdir(path, limit=1000).entries
        pending.extend(e.path for e in listing if e.kind == "directory")
    return found


def test_links_and_removes_of_one_file_keep_its_count(
    services: list[Metadata], engine: Engine
) -> None:
    for round_ in range(4):
        services[0].commits.commit((file(f"/d/f{round_}", [chunk(round_)]),))

        def link_or_remove(ns: Metadata, i: int, r: int = round_) -> Any:
            if i % 4 == 0:
                return ns.namespace.remove(f"/d/f{r}")
            return ns.namespace.link(f"/d/f{r}", f"/d/g{r}-{i}")

        race(services, link_or_remove)
        consistent(services[0], engine)
    left = engine.sql("SELECT COUNT(*) FROM entries")[0][0]
    assert left >= 1  # the directory, at least; what stays is checked by ``consistent``


def test_removing_a_tree_while_files_land_in_it(services: list[Metadata], engine: Engine) -> None:
    for round_ in range(4):
        services[0].namespace.mkdir(f"/t{round_}/sub", parents=True)

        def write_or_remove(ns: Metadata, i: int, r: int = round_) -> Any:
            if i == 0:
                return ns.namespace.remove(f"/t{r}", recursive=True)
            return ns.commits.commit((file(f"/t{r}/sub/f{i}", [chunk(i)]),))

        results = race(services, write_or_remove)
        assert not [r for r in results if isinstance(r, GrabenError)]  # commits make parents
        # What landed after the removal is listed; nothing is left in a removed tree.
        try:
            left = names(services[1], f"/t{round_}/sub")
        except NotFound:
            left = []
        landed = engine.sql("SELECT COUNT(*) FROM inodes WHERE kind = 'file'")[0][0]
        assert len(left) <= landed
        consistent(services[0], engine)
    assert engine.sql("SELECT COUNT(*) FROM chunks WHERE refs < 0")[0][0] == 0


def test_a_keyed_commit_raced_through_two_services_applies_once(
    services: list[Metadata], engine: Engine
) -> None:
    commit = (file("/k/f", [chunk(7)]),)
    results = race(services, lambda ns, i: ns.commits.commit(commit, key="one-key"))
    assert not [r for r in results if isinstance(r, GrabenError)]
    assert len({r[0].inode for r in results}) == 1  # every repeat got the first reply
    assert services[0].namespace.stat("/k/f").generation == 1
    consistent(services[0], engine)
