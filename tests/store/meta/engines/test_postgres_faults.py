"""Several metadata services on one engine, and an engine that fails under them.

Two ``Metadata``s on one store stand for two metadata services: each has
its own repository (its own connections), as two processes on two hosts
would. They race on the same directory, the same path, the same chunks; the
races run on SQLite too, whose single writer is the behaviour PostgreSQL
must match. Then PostgreSQL is cut off: connections killed while idle, the
server restarted mid-write, the server down.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from pg_kit import MIGRATIONS, Engine, PgServer, chunk, file, names, refs

from graben.store import AlreadyExists, GrabenError, NotFound, PermissionDenied, Unavailable
from graben.store.meta import Metadata
from graben.store.meta._repo import ROOT_INODE
from graben.store.meta.engines._postgres import PostgresRepository
from graben.store.meta.engines._postgres_schema import (
    IDLE_IN_TRANSACTION_S,
    configure,
    connect_options,
)
from graben.store.meta.engines._postgres_url import display_url

WORKERS = 6
ROUNDS = 5


def _services(engine: Engine) -> list[Metadata]:
    return [Metadata(engine.open()), Metadata(engine.open())]


def _together(work: Callable[[int], Any], workers: int = WORKERS) -> list[Any]:
    """``work(0..workers-1)`` on as many threads, started at one moment; their results."""
    start = threading.Barrier(workers)

    def run(worker: int) -> Any:
        start.wait()
        return work(worker)

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(run, range(workers)))


def _reachable(ns: Metadata, path: str = "/") -> int:
    """Inodes reachable from ``path`` (itself included)."""
    entries = ns.namespace.listdir(path, limit=10_000).entries
    if entries and entries[0].path == path:  # a file lists as itself
        return 1
    return 1 + sum(_reachable(ns, e.path) if e.is_dir else 1 for e in entries)


# -- two services, one engine ---------------------------------------------------------------


def test_two_services_commit_into_one_directory_without_losing_an_entry(engine: Engine) -> None:
    services = _services(engine)
    shared = chunk(0)
    files = 8

    def work(worker: int, base: str) -> list[str]:
        ns = services[worker % 2]
        paths = [f"{base}/flat/w{worker}-{i}" for i in range(files)]
        for i in range(0, files, 2):  # half alone, half as a group commit of two batches
            one, two = (file(p, [shared, chunk(zlib.crc32(p.encode()))]) for p in paths[i : i + 2])
            if i % 4:
                ns.commits.commit((one,))
                ns.commits.commit((two,))
            else:
                assert all(isinstance(r, list) for r in ns.commits.commit_group([(one,), (two,)]))
        ns.commits.commit((file(f"{base}/deep/a/b/c/w{worker}", [shared]),))  # parents made by all
        return paths

    for round_ in range(ROUNDS):
        base = f"/r{round_}"
        done = _together(lambda w, base=base: work(w, base))  # type: ignore[misc]
        wanted = sorted(p.rsplit("/", 1)[1] for paths in done for p in paths)
        assert names(services[round_ % 2], f"{base}/flat") == wanted  # none lost, none twice
        assert names(services[0], f"{base}/deep/a/b") == ["c"]
        assert len(names(services[1], f"{base}/deep/a/b/c")) == WORKERS
    assert refs(engine, shared) == ROUNDS * WORKERS * (files + 1)
    assert services[0].records.check_metadata() == []


def test_racing_exclusive_creates_have_one_winner(engine: Engine) -> None:
    services = _services(engine)
    for round_ in range(4 * ROUNDS):
        path = f"/race/x{round_}"

        def attempt(worker: int, path: str = path) -> int | None:
            try:
                services[worker % 2].commits.commit((file(path, [chunk(worker)], mode="create"),))
            except AlreadyExists:
                return None
            return worker

        winners = [w for w in _together(attempt) if w is not None]
        assert len(winners) == 1
        layout = services[1].namespace.layout(path)
        assert layout.info.generation == 1
        assert [x.chunk.id for x in layout.extents] == [chunk(winners[0]).id]
    assert services[0].records.check_metadata() == []


def test_racing_overwrites_count_every_version(engine: Engine) -> None:
    services = _services(engine)
    versions = 10

    def overwrite(worker: int) -> None:
        for _ in range(versions):
            services[worker % 2].commits.commit((file("/hot", [chunk(worker)]),))

    _together(overwrite)
    info = services[0].namespace.stat("/hot")
    assert info.generation == WORKERS * versions  # no version lost its increment
    assert sorted(refs(engine, chunk(w)) for w in range(WORKERS)) == [0] * (WORKERS - 1) + [1]
    assert services[1].records.check_metadata() == []
    assert len(services[1].records.collectable(0)) == WORKERS - 1


def test_racing_directory_renames_never_cut_a_tree_loose(engine: Engine) -> None:
    services = _services(engine)
    for round_ in range(4 * ROUNDS):
        base = f"/c{round_}"
        services[0].namespace.mkdir(f"{base}/a/inside", parents=True)
        services[0].namespace.mkdir(f"{base}/b")
        moves = [(f"{base}/a", f"{base}/b/a"), (f"{base}/b", f"{base}/a/b")]

        def move(worker: int, moves: list[tuple[str, str]] = moves) -> str:
            try:
                services[worker].namespace.rename(*moves[worker])
            except GrabenError as exc:
                return type(exc).__name__
            return "moved"

        assert "moved" in _together(move, 2)
    (total,) = engine.sql("SELECT COUNT(*) FROM inodes")[0]
    assert _reachable(services[0]) == total  # no cycle hangs loose from the root
    assert services[1].records.check_metadata() == []


def test_collection_never_takes_a_chunk_a_racing_commit_uses(engine: Engine) -> None:
    services = _services(engine)
    for round_ in range(4 * ROUNDS):
        reused = chunk(10_000 + round_)
        services[0].commits.commit((file(f"/gc/old{round_}", [reused]),))
        services[0].namespace.remove(f"/gc/old{round_}")  # unreferenced now, collectable at once

        def race(worker: int, round_: int = round_, reused: Any = reused) -> None:
            if worker == 0:
                services[0].records.collectable(0)
            else:
                services[1].commits.commit((file(f"/gc/new{round_}", [reused]),))

        _together(race, 2)
        assert services[1].namespace.layout(f"/gc/new{round_}").extents[0].chunk == reused
        assert refs(engine, reused) == 1
    assert services[0].records.check_metadata() == []


def test_services_starting_together_on_a_new_database_make_one_store(engine: Engine) -> None:
    ids = _together(lambda _: Metadata(engine.open()).store_id, 4)
    assert len(set(ids)) == 1
    assert engine.version() == MIGRATIONS


# -- PostgreSQL failing under the services ----------------------------------------------------


@pytest.fixture
def pg_services(pg_url: str) -> Iterator[list[Metadata]]:
    repos = [PostgresRepository(pg_url, create=True) for _ in range(2)]
    try:
        yield [Metadata(repo) for repo in repos]
    finally:
        for repo in repos:
            repo.close()


def _kill_connections(server: PgServer, database: str) -> int:
    rows = server.sql(
        database,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid != pg_backend_pid()",
    )
    return len(rows)


def test_connections_killed_while_idle_are_replaced_unseen(
    pg_server: PgServer, pg_database: str, pg_services: list[Metadata]
) -> None:
    one, two = pg_services
    one.namespace.mkdir("/before")
    two.namespace.stat("/before")
    for round_ in range(ROUNDS):
        assert _kill_connections(pg_server, pg_database) >= 2  # each service's pooled one
        one.namespace.mkdir(f"/after-{round_}")  # a write, then a read, each on a new connection
        assert two.namespace.stat(f"/after-{round_}").kind == "directory"
    assert len(names(two, "/")) == ROUNDS + 1


def test_writes_through_a_restart_are_whole_or_absent(
    pg_server: PgServer, pg_services: list[Metadata]
) -> None:
    committed: list[str] = []
    refused: list[tuple[str, Unavailable]] = []
    stop = threading.Event()

    def writer(worker: int) -> None:
        i = 0
        while not stop.is_set():
            path = f"/w{worker}/f{i}"
            parts = [chunk(worker * 10**6 + i), chunk(worker * 10**6 + i + 500_000)]
            try:
                pg_services[worker % 2].commits.commit((file(path, parts),))
                committed.append(path)
            except Unavailable as exc:
                refused.append((path, exc))
            i += 1

    with ThreadPoolExecutor(4) as pool:
        running = [pool.submit(writer, w) for w in range(4)]
        time.sleep(0.5)
        pg_server.restart()
        time.sleep(0.5)
        stop.set()
        for future in running:
            future.result()  # anything but Unavailable fails the test here
    assert committed
    ns = pg_services[0]
    for path in committed:
        assert len(ns.namespace.layout(path).extents) == 2
    for path, exc in refused:  # whole if the commit got through before the cut, else absent
        assert pg_server.password not in str(exc)
        with contextlib.suppress(NotFound):
            assert len(ns.namespace.layout(path).extents) == 2
    assert ns.records.check_metadata() == []
    for service in pg_services:  # both serve again at once
        service.commits.commit((file(f"/after/{uuid.uuid4().hex}", [chunk(1)]),))


def test_a_server_that_stays_down_is_a_clear_unavailable(pg_server: PgServer, pg_url: str) -> None:
    repo = PostgresRepository(pg_url, create=True, wait_s=1.0)
    ns = Metadata(repo)
    try:
        ns.namespace.mkdir("/a")
        pg_server.stop()
        try:
            started = time.monotonic()
            with pytest.raises(Unavailable) as info:
                ns.namespace.mkdir("/b")
            assert time.monotonic() - started < 10
            assert display_url(pg_url) in str(info.value)
            assert pg_server.password not in str(info.value)
            with pytest.raises(Unavailable):
                ns.namespace.stat("/a")
        finally:
            pg_server.start()
        deadline = time.monotonic() + 30
        while True:  # the pool connects again by itself
            try:
                ns.namespace.mkdir("/b")
                break
            except Unavailable:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert names(ns, "/") == ["a", "b"]
    finally:
        repo.close()


def test_writers_wait_only_for_the_rows_they_change(
    pg_url: str, pg_services: list[Metadata]
) -> None:
    one, two = pg_services
    one.namespace.mkdir("/busy")
    one.namespace.mkdir("/free")
    busy = one.namespace.stat("/busy").inode
    with psycopg.connect(pg_url) as outside:  # a transaction holding /busy's row
        outside.execute("SELECT 1 FROM inodes WHERE id = %s FOR UPDATE", (busy,))
        writing = threading.Thread(
            target=one.commits.commit, args=((file("/busy/f", [chunk(1)]),),)
        )
        writing.start()
        writing.join(0.5)
        assert writing.is_alive()  # a writer into /busy waits for the row ...
        two.commits.commit((file("/free/g", [chunk(2)]),))  # ... one elsewhere does not wait
        assert names(two, "/free") == ["g"]
        assert names(two, "/busy") == []  # ... nor do readers
        outside.rollback()
        writing.join(10)
    assert not writing.is_alive()
    assert names(two, "/busy") == ["f"]


def test_commits_are_durable_whatever_the_server_default(
    pg_server: PgServer, pg_database: str, pg_url: str
) -> None:
    pg_server.sql(pg_database, f'ALTER DATABASE "{pg_database}" SET synchronous_commit = off')
    repo = PostgresRepository(pg_url, create=True)
    try:
        shown = repo.transact(lambda tx: tx.sql.one("SHOW synchronous_commit"))
        assert shown == ("on",)
    finally:
        repo.close()


def test_a_missing_database_is_made_only_when_asked(pg_server: PgServer) -> None:
    name = f"new_{uuid.uuid4().hex[:8]}"
    with pytest.raises(NotFound, match="does not exist") as info:
        PostgresRepository(pg_server.url(name), create=False)
    assert f"graben@127.0.0.1:{pg_server.port}/{name}" in str(info.value)
    assert pg_server.password not in str(info.value)
    assert not pg_server.sql("postgres", "SELECT 1 FROM pg_database WHERE datname = %s", name)
    try:
        repo = PostgresRepository(pg_server.url(name), create=True)
        assert len(Metadata(repo).store_id) == 32
        repo.close()
    finally:
        pg_server.drop_database(name)


def test_a_wrong_password_is_refused_without_repeating_it(pg_server: PgServer) -> None:
    url = pg_server.url("postgres").replace(pg_server.password, "not-the-password")
    with pytest.raises(PermissionDenied, match="refused the login") as info:
        PostgresRepository(url, create=False)
    assert "not-the-password" not in str(info.value)
    assert display_url(url) == f"postgresql://graben@127.0.0.1:{pg_server.port}/postgres"


def test_urls_in_messages_lose_their_passwords() -> None:
    url = "postgresql://meta:s3cret@db.example:5433/graben?sslmode=require&password=s3cret"
    assert display_url(url) == "postgresql://meta@db.example:5433/graben?sslmode=require"


def test_a_url_of_several_hosts_connects_only_to_the_one_that_takes_writes() -> None:
    one = "postgresql://meta@db1:5432/graben"
    assert "target_session_attrs" not in connect_options(one)
    several = "postgresql://meta:s3cret@db1:5432,db2:5432/graben"
    assert connect_options(several)["target_session_attrs"] == "read-write"
    assert display_url(several) == "postgresql://meta@db1:5432,db2:5432/graben"
    chosen = f"{several}?target_session_attrs=primary"  # the URL's own choice stands
    assert "target_session_attrs" not in connect_options(chosen)


def test_amcheck_runs_with_fsck_where_installed(
    pg_server: PgServer, pg_database: str, pg_services: list[Metadata]
) -> None:
    pg_server.sql(pg_database, "CREATE EXTENSION amcheck")
    ns = pg_services[0]
    for i in range(20):
        ns.commits.commit((file(f"/d/f{i}", [chunk(i), chunk(i + 100)]),))
    assert ns.records.check_metadata() == []


def test_a_writer_kept_waiting_too_long_is_told_the_engine_is_busy(pg_url: str) -> None:
    repo = PostgresRepository(pg_url, create=True, busy_s=0.5)
    ns = Metadata(repo)
    try:
        with psycopg.connect(pg_url) as outside:  # a transaction holding the root's row
            outside.execute("SELECT 1 FROM inodes WHERE id = 1 FOR UPDATE")
            with pytest.raises(Unavailable, match="busy"):
                ns.namespace.mkdir("/late")
            assert names(ns, "/") == []
            outside.rollback()
        ns.namespace.mkdir("/late")
        assert names(ns, "/") == ["late"]
    finally:
        repo.close()


def test_a_service_paused_mid_transaction_holds_nobody_up_for_long(engine: Engine) -> None:
    """A service that stops talking inside a transaction (SIGSTOPped, its host cut off)
    must not hold its locks for as long as it is away: the server ends the transaction
    after ``IDLE_IN_TRANSACTION_S``, and the other services' writes go on."""
    if engine.name != "postgresql":
        pytest.skip("SQLite has one writer in one process: no other service to wait")
    paused = psycopg.connect(engine.location, **connect_options(engine.location))
    configure(paused)
    other = Metadata(engine.open())
    try:
        paused.execute("BEGIN")
        paused.execute("SELECT id FROM inodes WHERE id = %s FOR UPDATE", (ROOT_INODE,))
        started = time.monotonic()
        other.namespace.mkdir("/made-while-the-other-slept")  # needs the root's row
        waited = time.monotonic() - started
        assert IDLE_IN_TRANSACTION_S - 1 < waited < IDLE_IN_TRANSACTION_S + 3, waited
        with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):  # its tx is gone
            paused.execute("SELECT 1")
    finally:
        paused.close()
        other.repo.close()
