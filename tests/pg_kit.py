"""A throwaway PostgreSQL server for the tests: never the system's service.

``PgServer`` (``graben.bench._postgres``, which the bench uses too) makes a
cluster of its own with ``initdb`` in a temporary directory and runs it with
``pg_ctl`` on a free loopback port, fsync on. The session fixture ``pg_server``
starts one for the whole session and stops and removes it at the end, also
when the session fails; where PostgreSQL is missing or will not start, the
tests that need it skip with the reason. ``pg_url`` is a new, empty database
per test, and ``engine`` a new store's engine, SQLite and PostgreSQL in turn.
A test module uses a fixture by importing its function (``pg_url_fixture``
for ``pg_url``, and those it depends on).

Clients log in over TCP as the superuser ``graben`` with a password, so the
tests also see that no message repeats it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from cluster_kit import LocalCluster

from graben.bench._postgres import NoPostgres, PgServer, start
from graben.store._types import ChunkRef, Extent, FileCommit, Receipt, StoredChunk
from graben.store.meta import Metadata
from graben.store.meta.engines._sums import FUNCTION, SUMMED, row_sum
from graben.store.wire._auth import RECEIPT_TTL_S

AFTER_ANY_COLLECTION = 2.0**33
"""A time (the year 2242) after every cutoff a test's collection takes copies under."""
MIGRATIONS = 18
"""The schema version graben writes today."""


def start_or_skip() -> PgServer:
    """A running server, or ``pytest.skip`` saying why there cannot be one."""
    try:
        return start()
    except NoPostgres as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session", name="pg_server")
def pg_server_fixture() -> Iterator[PgServer]:
    """A PostgreSQL server for the session, stopped and removed after it."""
    server = start_or_skip()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module", name="pg_cluster")
def pg_cluster_fixture(
    pg_server: PgServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A 3-node cluster whose metadata service runs on PostgreSQL, for the module; its URL."""
    database = pg_server.create_database()
    root = tmp_path_factory.mktemp("pg-cluster")
    try:
        cluster = LocalCluster(root, nodes=3, engine=pg_server.url(database))
        try:
            yield cluster.url
        finally:
            cluster.close()
    finally:
        pg_server.drop_database(database)


@pytest.fixture(name="pg_database")
def pg_database_fixture(pg_server: PgServer) -> Iterator[str]:
    """The name of a new, empty database, dropped after the test."""
    name = pg_server.create_database()
    try:
        yield name
    finally:
        pg_server.drop_database(name)


@pytest.fixture(name="pg_url")
def pg_url_fixture(pg_server: PgServer, pg_database: str) -> str:
    """``postgresql://graben:PASSWORD@127.0.0.1:PORT/DB`` of a new, empty database."""
    return pg_server.url(pg_database)


# -- one suite, two engines ----------------------------------------------------------------


class Engine:
    """One store's engine for a test: repositories on it, and SQL behind graben's back."""

    def __init__(self, name: str, location: str) -> None:
        self.name = name
        self.location = location
        """The SQLite file, or the PostgreSQL URL (with its password)."""
        self._opened: list[Any] = []

    def open(self, *, create: bool = True, **options: Any) -> Any:
        """A new repository on the store (another service's, as far as the store can tell)."""
        if self.name == "sqlite":
            from graben.store.meta.engines._sqlite import SQLiteRepository

            repo: Any = SQLiteRepository(self.location, create=create)
        else:
            from graben.store.meta.engines._postgres import PostgresRepository

            repo = PostgresRepository(self.location, create=create, **options)
        self._opened.append(repo)
        return repo

    def sql(self, statement: str, *params: object) -> list[tuple[Any, ...]]:
        """Run one statement (``%s`` placeholders) outside graben and commit it; its rows."""
        if self.name == "sqlite":
            import sqlite3

            conn = sqlite3.connect(self.location)
            conn.create_function(FUNCTION, -1, row_sum, deterministic=True)  # as graben does
            try:
                rows = conn.execute(statement.replace("%s", "?"), params).fetchall()
                conn.commit()
            finally:
                conn.close()
            return rows
        import psycopg

        with psycopg.connect(self.location, autocommit=True) as pg:
            cur = pg.execute(statement, params or None)
            return cur.fetchall() if cur.description else []

    def back_to_7(self) -> None:
        """Take back schemas 8 to 18, row checksums, the change feed, storage classes,
        tenants, the record of encryption, backups' holds, the nodes' stored bytes and
        scrub time, their drain state, collection's records, the services' schema
        versions and the servers' metrics addresses (a store as an older graben left
        it)."""
        for table in SUMMED:
            self.sql(f"ALTER TABLE {table} DROP COLUMN sum")
        tables = ("changes", "classes", "pieces", "tenants", "tokens", "quotas")
        for table in (*tables, "backups", "collected"):
            self.sql(f"DROP TABLE {table}")
        for column in ("sealed", "restored_ns", "freed_chunks", "freed_bytes"):
            self.sql(f"ALTER TABLE store DROP COLUMN {column}")
        for column in ("stored", "scrubbed", "state", "metrics"):
            self.sql(f"ALTER TABLE nodes DROP COLUMN {column}")
        for column in ("schema_version", "metrics"):
            self.sql(f"ALTER TABLE services DROP COLUMN {column}")

    def set_version(self, version: int) -> None:
        """Record ``version`` as the store's schema version."""
        if self.name == "sqlite":
            self.sql(f"PRAGMA user_version = {version}")
        else:
            self.sql("UPDATE schema_version SET version = %s", version)

    def version(self) -> int:
        """The schema version the store records."""
        if self.name == "sqlite":
            return int(self.sql("PRAGMA user_version")[0][0])
        return int(self.sql("SELECT version FROM schema_version")[0][0])

    def close(self) -> None:
        for repo in self._opened:
            repo.close()


@pytest.fixture(params=["sqlite", "postgresql"], name="engine")
def engine_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """A new store's engine, SQLite and PostgreSQL in turn: the tests run on both."""
    if request.param == "sqlite":
        found = Engine("sqlite", str(tmp_path / "meta.db"))
    else:
        found = Engine("postgresql", request.getfixturevalue("pg_url"))
    try:
        yield found
    finally:
        found.close()


# -- namespace helpers -------------------------------------------------------------------------


def chunk(i: int, length: int = 1000) -> ChunkRef:
    """A chunk record (no bytes behind it: the namespace never reads them)."""
    return ChunkRef(hashlib.blake2b(str(i).encode(), digest_size=32).hexdigest(), length, i)


def file(
    path: str, chunks: Sequence[ChunkRef], *, nodes: tuple[str, ...] = ("n1",), **kw: object
) -> FileCommit:
    """A commit of a file made of ``chunks`` in order, each stored on ``nodes`` after any
    collection a test makes (each node's receipt says so, unsigned: the namespace reads
    only its time; the same each time, as a repeated request's must be)."""
    extents, at = [], 0
    for c in chunks:
        extents.append(Extent(at, c.length, c, 0))
        at += c.length
    expires = AFTER_ANY_COLLECTION + RECEIPT_TTL_S
    stored = tuple(
        StoredChunk(c, nodes, receipts=tuple(Receipt(c.id, n, expires, "") for n in nodes))
        for c in {c.id: c for c in chunks}.values()
    )
    return FileCommit(path, tuple(extents), stored, **kw)  # type: ignore[arg-type]


def refs(engine: Engine, c: ChunkRef) -> int:
    """The reference count the engine keeps for a chunk."""
    return int(engine.sql("SELECT refs FROM chunks WHERE id = %s", c.id)[0][0])


def names(ns: Metadata, path: str) -> list[str]:
    """The names in a directory, in the order listed."""
    return [e.path.rsplit("/", 1)[1] for e in ns.namespace.listdir(path, limit=1000).entries]
