"""The PostgreSQL engine: the three layers in one database several metadata services share.

The schema, its migrations and their numbering are SQLite's (see
``_postgres_schema.py``), and so is a newer schema's refusal. A database
without graben's schema becomes a store only when asked (``create=True``;
the database itself is made too if it is missing and the login may): a
mistyped URL must not pass for a new, empty store. Every message names the
URL without its password.

Writers: SQLite lets one writer in at a time; here several metadata
services share the engine and their writes commit side by side. A write
runs at READ COMMITTED (each statement sees every commit before it) and
keeps the namespace's invariants with the database's own row locks, taken
by the primitives (``_sql_tree.py``): names are unique by the primary key, a
row changed or deleted is locked till the commit, a change computed from a
row reads it ``FOR UPDATE``, a directory moves under one advisory lock (no
two moves make a cycle), and a primitive whose row a concurrent writer
deleted raises ``Conflict``. A transaction that meets a concurrent writer
that way (``Conflict``, a duplicate key, a deadlock, a serialization
failure) is rolled back and its function run again (``transact``), up to
``CONFLICT_RETRIES`` times with a short random pause; so none of those is
ever an error a client sees. ``transact`` (and ``read()``) also retry a
transaction that failed before the caller's function began (a pooled
connection that died idle: the server restarted). A failure inside the
function otherwise rolls back and is an error (``Unavailable`` for a lost
connection); a connection lost during COMMIT says the outcome is unknown.
Readers run at REPEATABLE READ, READ ONLY: one snapshot, never blocked by a
writer. Commits are durable: ``synchronous_commit`` is raised to ``on`` per
connection if the server's default is weaker.

Connections come from a pool (psycopg_pool) shared by the threads of one
service; a transaction holds one for its duration. The queries are
those of ``_sql_tx.py``, with PostgreSQL's own where it differs (``_postgres_tx.py``).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from functools import partial
from urllib.parse import urlsplit

import psycopg
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool, PoolTimeout
from psycopg_pool.base import AttemptWithBackoff

from ..._errors import (
    GrabenError,
    IntegrityError,
    InvalidArgument,
    NoSpace,
    NotFound,
    PermissionDenied,
    Unavailable,
)
from .._repo import Conflict, R, Tx
from ._postgres_schema import (
    BUSY_S,
    Connection,
    configure,
    connect_options,
    missing_database,
    open_database,
    prepare,
)
from ._postgres_tx import alive, postgres_tx
from ._postgres_url import SCHEMES, display_url

log = logging.getLogger("graben.postgres")
POOL_SIZE = 16
"""Connections one repository keeps at most (a metadata service runs 8 engine threads)."""
WAIT_S = 30.0
"""How long a transaction waits for a connection (the server restarting, or all busy)."""
RETRIES = 3
"""Attempts at starting a transaction whose connection fails before the caller's block."""
CONFLICT_RETRIES = 12
"""Runs of a write that keeps meeting concurrent writers before it is ``Unavailable``."""


# -- the repository ---------------------------------------------------------------------


RECONNECT_S = 30.0
"""How long the pool tries again to replace a lost connection before it starts afresh."""
# The pool tries again after 1 s, then twice as long each time (1, 2, 4 ... 128 s): after a
# standby is promoted, a service could go on waiting for a minute. Sooner, gentler: 0.2 s,
# then half as long again each time (under 10 s apart within ``RECONNECT_S``).
AttemptWithBackoff.INITIAL_DELAY = 0.2
AttemptWithBackoff.DELAY_BACKOFF = 1.5


class PostgresRepository:
    """The PostgreSQL engine (see ``Repository`` in ``meta/_repo.py``)."""

    def __init__(
        self,
        url: str,
        *,
        create: bool,
        migrate: bool = True,
        pool_size: int = POOL_SIZE,
        wait_s: float = WAIT_S,
        busy_s: float = BUSY_S,
    ) -> None:
        """Open the store in the database at ``url`` (``postgresql://user@host:port/db``);
        with ``create``, make it there if there is none (and the database, if missing).

        Without ``create``, a missing database, or one without graben's schema,
        is ``NotFound`` and is left as it was. A transaction waits ``wait_s`` for
        a connection, a writer ``busy_s`` for the others; then ``Unavailable``.
        Without ``migrate``, a schema older than this code's is refused, not migrated.
        """
        if urlsplit(url).scheme not in SCHEMES:
            raise InvalidArgument(f"not a PostgreSQL URL: {display_url(url)}")
        self.url = url
        self.where = display_url(url)
        """The URL without its password: what messages name."""
        self.location = self.where
        """The engine as an operator names it (``graben status`` shows it)."""
        self._wait_s = wait_s
        self.conflicts = 0
        """Write transactions run again because a concurrent writer conflicted."""
        try:
            with open_database(url, self.where, create=create) as db:
                prepare(db, self.where, create=create, migrate=migrate)
        except psycopg.Error as exc:
            raise _translate(exc, self.where) from exc
        self._pool: ConnectionPool[Connection] = ConnectionPool(
            url,
            kwargs=connect_options(url),
            min_size=1,
            max_size=pool_size,
            timeout=wait_s,
            configure=partial(configure, busy_s=busy_s),
            name="graben-meta",
            reconnect_timeout=RECONNECT_S,
            open=False,
        )
        try:
            self._pool.open(wait=True, timeout=wait_s)
        except PoolTimeout as exc:
            self._pool.close()
            raise Unavailable(f"cannot reach the metadata database: {exc}", self.where) from exc

    @contextmanager
    def read(self) -> Iterator[Tx]:
        with self._transaction("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY") as db:
            yield postgres_tx(db)

    def transact(self, work: Callable[[Tx], R]) -> R:
        for attempt in range(1, CONFLICT_RETRIES + 1):
            try:
                with self._transaction("BEGIN ISOLATION LEVEL READ COMMITTED") as db:
                    return work(postgres_tx(db, writing=True))
            except Conflict as exc:
                if attempt == CONFLICT_RETRIES:
                    raise Unavailable(
                        f"metadata writers kept conflicting ({attempt} attempts); try again: {exc}",
                        self.where,
                    ) from exc
                self.conflicts += 1
                time.sleep(random.uniform(0, min(0.05, 0.001 * 2**attempt)))
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._pool.close(timeout=5.0)

    @contextmanager
    def _transaction(self, begin: str) -> Iterator[Connection]:
        db = self._begin(begin)
        try:
            try:
                yield db
            except BaseException:
                _rollback(db)
                raise
            _commit(db, self.where)
        except psycopg.Error as exc:
            if not db.broken and (exc.sqlstate or "").startswith(_CONFLICT_STATES):
                raise Conflict(_first_line(exc)) from exc
            if db.broken:
                raise Unavailable(
                    "lost the connection to the metadata database; the transaction was "
                    f"rolled back: {_first_line(exc)}",
                    self.where,
                ) from exc
            raise _translate(exc, self.where) from exc
        finally:
            self._pool.putconn(db)

    def _begin(self, begin: str) -> Connection:
        """A pooled connection in a new transaction. A connection that fails before the
        caller's block (it died idle: the server restarted) is dropped and another tried."""
        for attempt in range(1, RETRIES + 1):
            db = self._connection()
            try:
                db.execute(begin)
                return db
            except psycopg.Error as exc:
                _rollback(db)
                self._pool.putconn(db)
                if attempt == RETRIES or not _retryable(db, exc):
                    raise _translate(exc, self.where) from exc
                log.info("the metadata database dropped a connection (%s); trying again", exc)
                self._pool.check()  # its idle siblings likely died the same way
        raise AssertionError("unreachable")

    def _connection(self) -> Connection:
        try:
            return self._pool.getconn()
        except PoolTimeout as exc:
            raise Unavailable(
                f"no connection to the metadata database within {self._wait_s:g} s "
                "(is the server up?)",
                self.where,
            ) from exc
        except psycopg.Error as exc:  # the pool is closed
            raise Unavailable(f"the metadata engine is closed: {exc}", self.where) from exc


def _commit(db: Connection, where: str) -> None:
    if db.info.transaction_status == TransactionStatus.INERROR:
        # PostgreSQL answers COMMIT of a failed transaction with a silent ROLLBACK.
        _rollback(db)
        raise GrabenError("the metadata transaction failed and was rolled back", where)
    try:
        db.execute("COMMIT")
    except psycopg.Error as exc:
        if _retryable(db, exc):
            raise Unavailable(
                "lost the connection to the metadata database while committing: the change "
                "may or may not have been applied; check before repeating it",
                where,
            ) from exc
        raise


def _rollback(db: Connection) -> None:
    if alive(db):
        with suppress(psycopg.Error):  # the error being raised says more
            db.execute("ROLLBACK")


# -- errors ------------------------------------------------------------------------------

_CONFLICT_STATES = ("40001", "40P01", "23505")
"""SQLSTATEs of a write that met a concurrent one: serialization failure, deadlock, a name or
key another writer took first. The function runs again (``transact``)."""
_RETRY_STATES = ("08", "57P01", "57P02", "57P03", "40001", "40P01")
"""SQLSTATEs (or their classes) of a failure worth a new transaction on another connection."""
_BY_STATE: tuple[tuple[str, type[GrabenError], str], ...] = (
    ("53100", NoSpace, "metadata disk is full; the change was rolled back"),
    ("53", Unavailable, "the metadata database is out of resources"),
    ("XX001", IntegrityError, "metadata database is damaged"),
    ("XX002", IntegrityError, "metadata database is damaged (an index)"),
    ("40001", Unavailable, "metadata writers conflicted; try again"),
    ("40P01", Unavailable, "metadata writers deadlocked; try again"),
    ("55P03", Unavailable, "metadata database is busy"),
    ("57014", Unavailable, "a metadata statement was cancelled"),
    ("08", Unavailable, "lost the connection to the metadata database"),
    ("57P", Unavailable, "the metadata database is shutting down or starting"),
    ("28", PermissionDenied, "the metadata database refused the login"),
    ("42501", PermissionDenied, "the metadata database refused"),
    ("3D000", NotFound, "no graben metadata database here"),
)


def _retryable(db: Connection, exc: psycopg.Error) -> bool:
    return db.broken or (exc.sqlstate or "").startswith(_RETRY_STATES)


def _first_line(exc: psycopg.Error) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _translate(exc: psycopg.Error, where: str) -> GrabenError:
    text = _first_line(exc)
    state = exc.sqlstate or ""
    for prefix, kind, what in _BY_STATE:
        if state.startswith(prefix):
            return kind(f"{what}: {text}", where)
    if missing_database(exc):
        return NotFound(f"no graben metadata database here: {text}", where)
    if "password authentication failed" in text:
        return PermissionDenied(f"the metadata database refused the login: {text}", where)
    if isinstance(exc, psycopg.OperationalError):
        return Unavailable(f"cannot reach the metadata database: {text}", where)
    return GrabenError(f"metadata engine error: {text}", where)
