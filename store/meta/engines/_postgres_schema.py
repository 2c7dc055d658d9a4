"""The PostgreSQL engine's database: made, brought up to date, and cross-checked for fsck.

The migrations are ``_schema.py``'s, in PostgreSQL's words; the
version lives in a one-row table ``schema_version``. Migrations run in one
transaction holding the schema lock, so two services starting together on a
new database do not both create it. Connection failures surface here as
psycopg errors; ``_postgres.py`` translates them.

The cross-checks are ``_checks.py``'s, in PostgreSQL's words. They read
the tables themselves (index scans off), not the indexes, which may
still hold a value from before the damage; where the ``amcheck`` extension
is installed, each index is checked against its table as well.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import psycopg
from psycopg import sql

from ..._errors import IntegrityError, InvalidArgument, NotFound, PermissionDenied
from ..._types import ChunkProblem
from ._checks import Dialect, PathOf
from ._checks import inconsistencies as _inconsistencies
from ._schema import (
    POSTGRES,
    SCHEMA_VERSION,
    live_services_query,
    refuse_live_services,
    refuse_newer,
    refuse_older,
    scripts,
)

Connection = psycopg.Connection[tuple[Any, ...]]
SCHEMA_LOCK = 0x67726162656E
"""The advisory lock a migration holds (``"graben"``): services starting together migrate once."""
BUSY_S = 60.0
IDLE_IN_TRANSACTION_S = 5.0
"""Longest a service's transaction may sit silent (the service paused, hung or cut off)
before PostgreSQL ends it and frees its locks: nobody else waits longer on it."""
"""How long a writer waits for a row another holds, by default (SQLite's busy timeout)."""
CONNECT_TIMEOUT_S = 10


TABLES = (
    *("inodes", "entries", "chunks", "extents", "replicas", "nodes", "store"),
    *("outcomes", "services", "lease", "bad_copies"),
)


# -- connections --------------------------------------------------------------------------


def connect_options(url: str) -> dict[str, Any]:
    """Connection options graben needs, and defaults the URL may override."""
    given = psycopg.conninfo.conninfo_to_dict(url)
    options: dict[str, Any] = {"autocommit": True, "fallback_application_name": "graben-meta"}
    if "connect_timeout" not in given:
        options["connect_timeout"] = CONNECT_TIMEOUT_S
    if "," in str(given.get("host", "")) and "target_session_attrs" not in given:
        # Several hosts: a primary and its standbys. Only the primary takes writes; after a
        # failover, the one promoted.
        options["target_session_attrs"] = "read-write"
    return options


def configure(db: Connection, busy_s: float = BUSY_S) -> None:
    """Durable commits whatever the server's default; wait ``busy_s`` for a lock at most;
    a transaction left idle ``IDLE_IN_TRANSACTION_S`` is ended by the server (unless the
    engine URL's ``options`` set a bound of their own)."""
    row = db.execute(
        "SELECT current_setting('synchronous_commit'), "
        "current_setting('idle_in_transaction_session_timeout')"
    ).fetchone()
    if row is not None and row[0] in ("off", "local"):
        db.execute("SET synchronous_commit = on")
    if row is not None and row[1] == "0":
        db.execute(f"SET idle_in_transaction_session_timeout = {int(IDLE_IN_TRANSACTION_S * 1000)}")
    db.execute(f"SET lock_timeout = {int(busy_s * 1000)}")


def missing_database(exc: psycopg.Error) -> bool:
    """Whether ``exc`` says the database does not exist."""
    # A failed login carries no SQLSTATE; the server's message is all there is.
    text = str(exc)
    return exc.sqlstate == "3D000" or ("database" in text and "does not exist" in text)


def open_database(url: str, where: str, *, create: bool) -> Connection:
    """A direct connection to the database; with ``create``, the database is made if missing."""
    try:
        db = psycopg.connect(url, **connect_options(url))
    except psycopg.OperationalError as exc:
        if not missing_database(exc):
            raise
        if not create:
            raise NotFound(
                "no graben metadata database here (the database does not exist)", where
            ) from None
        _create_database(url, where)
        db = psycopg.connect(url, **connect_options(url))
    try:
        configure(db)
    except BaseException:
        db.close()
        raise
    return db


def _create_database(url: str, where: str) -> None:
    name = str(psycopg.conninfo.conninfo_to_dict(url).get("dbname"))
    create = sql.SQL("CREATE DATABASE {} TEMPLATE template0 ENCODING 'UTF8' LOCALE 'C'")
    try:
        with psycopg.connect(url, **{**connect_options(url), "dbname": "postgres"}) as admin:
            admin.execute(create.format(sql.Identifier(name)))
    except psycopg.errors.DuplicateDatabase:
        return  # another service made it meanwhile
    except psycopg.errors.InsufficientPrivilege as exc:
        raise PermissionDenied(
            "the database does not exist and this login may not create it: create it "
            f"(createdb {name}) or name one that exists",
            where,
        ) from exc


# -- the schema ---------------------------------------------------------------------------


def prepare(db: Connection, where: str, *, create: bool, migrate: bool = True) -> None:
    """Check the database and bring its schema up to date, in one locked transaction.

    Without ``create``, a database without graben's schema (and no tables) is ``NotFound``.
    """
    encoding = db.execute("SHOW server_encoding").fetchone()
    if encoding is None or encoding[0] != "UTF8":
        raise InvalidArgument(
            f"the database's encoding is {encoding and encoding[0]}; graben needs UTF8 "
            "(CREATE DATABASE ... ENCODING 'UTF8')",
            where,
        )
    if not create and _version(db) == 0 and not _has_tables(db):
        raise NotFound("no graben metadata database here (the database is empty)", where)
    db.execute(f"BEGIN; SELECT pg_advisory_xact_lock({SCHEMA_LOCK})")
    try:
        _migrate(db, where, migrate)
    except BaseException:
        if db.info.transaction_status != psycopg.pq.TransactionStatus.UNKNOWN:
            db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _migrate(db: Connection, where: str, migrate: bool) -> None:
    version = _version(db)
    refuse_newer(version, where)
    if not migrate:
        refuse_older(version, where)
    if version == 0 and _has_tables(db):
        raise IntegrityError("this database holds something else, not a graben store", where)
    query = live_services_query(version) if version < SCHEMA_VERSION else None
    if query is not None:
        now = db.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        assert now is not None
        refuse_live_services(version, db.execute(query).fetchall(), float(now[0]), where)
    if version == 0:
        db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        db.execute("INSERT INTO schema_version VALUES (0)")
    for number, statements in scripts(POSTGRES, version):
        for statement in statements:
            db.execute(statement)
        db.execute("UPDATE schema_version SET version = %s", (number,))


def _version(db: Connection) -> int:
    """The schema's version; 0 where there is none."""
    row = db.execute("SELECT to_regclass('schema_version') IS NOT NULL").fetchone()
    if row is None or not row[0]:
        return 0
    found = db.execute("SELECT version FROM schema_version").fetchone()
    return int(found[0]) if found else 0


def _has_tables(db: Connection) -> bool:
    row = db.execute(
        "SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'v', 'm', 'f') LIMIT 1"
    ).fetchone()
    return row is not None


# -- fsck: where the tables contradict each other -------------------------------------------

_HEX_ID = "{0} !~ '^[0-9a-f]{{64}}$'"
BAD_ROWS = {
    "inodes": (
        "SELECT id, 'inode ' || id || ' does not decode' FROM inodes "
        "WHERE kind NOT IN ('file', 'directory') OR size < 0 OR replication < 1"
    ),
    "entries": (
        "SELECT NULL::bigint, 'the entry ' || quote_literal(name) || ' in directory ' || "
        "parent || ' does not decode' FROM entries WHERE name = '' OR strpos(name, '/') > 0"
    ),
    "chunks": (
        "SELECT NULL::bigint, 'the chunk row ' || quote_literal(id) || ' does not decode' "
        f"FROM chunks WHERE {_HEX_ID.format('id')} OR length < 0 OR refs < 0 "
        "OR crc32c NOT BETWEEN 0 AND 4294967295"
    ),
    "extents": (
        "SELECT inode, 'the extent at offset ' || \"offset\" || ' does not decode' "
        f"FROM extents WHERE length <= 0 OR {_HEX_ID.format('chunk')} OR chunk_offset < 0"
    ),
}
"""Rows whose values cannot be what graben wrote: (inode or NULL, what is wrong)."""


def inconsistencies(db: Connection, path_of: PathOf, limit: int) -> list[ChunkProblem]:
    """Up to ``limit`` contradictions in the engine, as fsck problems of kind ``metadata``."""
    db.execute(
        "SET LOCAL enable_indexscan = off; SET LOCAL enable_indexonlyscan = off; "
        "SET LOCAL enable_bitmapscan = off"
    )
    dialect = Dialect(
        rows=lambda query: db.execute(query).fetchall(),
        table=lambda name, alias: f"{name} AS {alias}" if alias else name,
        bad_rows=BAD_ROWS,
        engine=partial(_engine, db),
    )
    return _inconsistencies(dialect, path_of, limit)


def _engine(db: Connection) -> Iterator[ChunkProblem]:
    """amcheck's verdict on each index, where the extension is installed."""
    if db.execute("SELECT 1 FROM pg_extension WHERE extname = 'amcheck'").fetchone() is None:
        return
    indexes = db.execute(
        "SELECT i.indexrelid::regclass::text FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid "
        "JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam "
        "WHERE t.relnamespace = current_schema()::regnamespace AND t.relname = ANY(%s) "
        "AND a.amname = 'btree' ORDER BY 1",
        (list(TABLES),),
    ).fetchall()
    for (index,) in indexes:
        db.execute("SAVEPOINT amcheck")
        try:
            db.execute("SELECT bt_index_check(%s::regclass, true)", (index,))
        except psycopg.Error as exc:
            db.execute("ROLLBACK TO SAVEPOINT amcheck")
            detail = f"amcheck of index {index}: {str(exc).strip()}"
            yield ChunkProblem("metadata", "", "engine", (), detail)
        db.execute("RELEASE SAVEPOINT amcheck")
