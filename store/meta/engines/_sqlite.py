"""The SQLite engine: one file, WAL, one durable transaction per mutation.

Several processes may share the database: SQLite's locks serialise writers
(``BEGIN IMMEDIATE`` takes the write lock up front, so two writers never
deadlock upgrading a read lock) and WAL lets readers run beside them.
Connections are per thread. The schema carries its version in
``PRAGMA user_version`` and is brought up to date by ``_schema.py``'s migrations in one
exclusive transaction.

A database is created only when asked (``create=True``): a mistyped path or
an emptied file must not pass for a new, empty store. The files are the
owner's alone (0600). The queries are the transaction's concerns
(``_sql_tx.py``) in SQLite's words (``_sqlite_tx.py``), which check rows as
they become values: damage in the file is an ``IntegrityError`` naming the
inode and path, never a wrong answer.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..._errors import GrabenError, IntegrityError, NoSpace, NotFound, Unavailable
from .._repo import Conflict, R, Tx
from ._schema import (
    SCHEMA_VERSION,
    SQLITE,
    live_services_query,
    refuse_live_services,
    refuse_newer,
    refuse_older,
    scripts,
)
from ._sqlite_tx import sqlite_tx
from ._sums import FUNCTION, row_sum

BUSY_TIMEOUT_S = 60.0
FILE_MODE = 0o600
"""The database and its -wal and -shm files (SQLite gives those the database's mode)."""


def _set_wal(db: sqlite3.Connection) -> None:
    """Switch to WAL, waiting out other processes that are creating the same store.

    SQLite answers "locked" at once, without its busy handler, when this
    pragma meets another connection's lock on a new database: two ranks
    opening a fresh store together failed that way.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    delay = 0.005
    while True:
        try:
            db.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(2 * delay, 0.2)


class SQLiteRepository:
    """The SQLite engine (see ``Repository`` in ``_repo.py``)."""

    def __init__(self, path: str | Path, *, create: bool = True, migrate: bool = True) -> None:
        """Open the engine at ``path``; with ``create``, make a new store if there is none.

        Without ``create``, a missing file, or one holding no schema (0 bytes,
        say), is ``NotFound`` and is left as it was. Without ``migrate``, a schema
        older than this code's is refused, not migrated (``refuse_older``).
        """
        self.path = str(path)
        self.location = f"sqlite://{Path(path).absolute()}"
        """The engine as an operator names it (``graben status`` shows it)."""
        self._local = threading.local()
        self._all: list[tuple[weakref.ref[threading.Thread], sqlite3.Connection]] = []
        """Every thread's connection (a thread's own is in ``_local``)."""
        self._lock = threading.Lock()
        if create:
            _make_private(self.path)
        else:
            _require_schema(self.path)
        try:
            self._migrate(migrate)
        except BaseException:
            self.close()
            raise

    def _connect(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            try:
                # mode=rw: never create the file behind the caller's back (it was
                # made, or found, above); a store deleted while open stays gone.
                db = sqlite3.connect(
                    _uri(self.path, "rw"),
                    timeout=BUSY_TIMEOUT_S,
                    isolation_level=None,
                    check_same_thread=False,
                    uri=True,
                )
                _set_wal(db)
                db.execute("PRAGMA synchronous = FULL")
                # The summed tables' ``sum`` columns are computed with it (``_sums.py``).
                db.create_function(FUNCTION, -1, row_sum, deterministic=True)
            except sqlite3.DatabaseError as exc:
                raise _translate(exc, self.path) from exc
            self._local.db = db
            with self._lock:
                self._close_orphans()
                self._all.append((weakref.ref(threading.current_thread()), db))
        return db

    def _close_orphans(self) -> None:
        """Close the connections of threads that ended (a client called from many
        short-lived threads would else keep three descriptors open for each)."""
        live = []
        for owner, db in self._all:
            thread = owner()
            if thread is not None and thread.is_alive():
                live.append((owner, db))
            else:
                db.close()
        self._all = live

    def _migrate(self, migrate: bool) -> None:
        try:
            self._apply_migrations(migrate)
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from exc

    def _apply_migrations(self, migrate: bool) -> None:
        with self._transaction("BEGIN EXCLUSIVE") as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            refuse_newer(version, self.path)
            if not migrate:
                refuse_older(version, self.path)
            if version == 0 and _has_tables(db):
                raise IntegrityError(
                    "this database holds something else, not a graben store", self.path
                )
            query = live_services_query(version) if version < SCHEMA_VERSION else None
            if query is not None:
                refuse_live_services(version, db.execute(query).fetchall(), time.time(), self.path)
            for number, statements in scripts(SQLITE, version):
                for statement in statements:
                    db.execute(statement)
                db.execute(f"PRAGMA user_version = {number}")

    @contextmanager
    def _transaction(self, begin: str) -> Iterator[sqlite3.Connection]:
        db = self._connect()
        try:
            db.execute(begin)
        except sqlite3.OperationalError as exc:
            raise Unavailable(f"metadata database is busy: {exc}", self.path) from exc
        try:
            yield db
            db.execute("COMMIT")
        except BaseException:
            # SQLite may already have rolled back by itself (a full disk does).
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    @contextmanager
    def read(self) -> Iterator[Tx]:
        try:
            with self._transaction("BEGIN DEFERRED") as db:
                yield sqlite_tx(db)
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from exc

    def transact(self, work: Callable[[Tx], R]) -> R:
        # One writer at a time (BEGIN IMMEDIATE): nothing can conflict, so a primitive's
        # Conflict means the tables contradict themselves, and running again cannot help.
        try:
            with self._transaction("BEGIN IMMEDIATE") as db:
                return work(sqlite_tx(db))
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from exc
        except Conflict as exc:
            raise IntegrityError(f"metadata damaged: {exc}", self.path) from exc

    def close(self) -> None:
        with self._lock:
            for _, db in self._all:
                db.close()
            self._all.clear()
        self._local = threading.local()


def _uri(path: str, mode: str) -> str:
    return f"{Path(path).absolute().as_uri()}?mode={mode}"


def _make_private(path: str) -> None:
    """Create the database file, empty and 0600, unless it exists (SQLite would make it
    0644, and its -wal and -shm files after it)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, FILE_MODE))
    except OSError as exc:
        raise Unavailable(f"cannot create the metadata database: {exc.strerror}", path) from exc


def _require_schema(path: str) -> None:
    """``NotFound`` unless ``path`` is a database with a schema; reads only."""
    missing = NotFound("no graben metadata database here (the file is missing or empty)", path)
    if not os.path.isfile(path):
        raise missing
    try:
        db = sqlite3.connect(_uri(path, "ro"), uri=True, timeout=BUSY_TIMEOUT_S)
        try:
            empty = db.execute("PRAGMA user_version").fetchone()[0] == 0 and not _has_tables(db)
        finally:
            db.close()
    except sqlite3.Error as exc:
        raise _translate(exc, path) from exc
    if empty:
        raise missing


def _has_tables(db: sqlite3.Connection) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone() is not None


def _translate(exc: sqlite3.Error, path: str) -> GrabenError:
    text = str(exc)
    if "database or disk is full" in text:
        return NoSpace("metadata disk is full; the change was rolled back", path)
    if "locked" in text or "busy" in text:
        return Unavailable(f"metadata database is busy: {text}", path)
    if "Could not decode to UTF-8" in text:  # a flipped bit in a name or a chunk id
        return IntegrityError(f"metadata damaged: a row does not decode: {text}", path)
    if "not a database" in text or "malformed" in text:
        return IntegrityError(f"metadata database is damaged or not a graben store: {text}", path)
    if isinstance(exc, sqlite3.OperationalError) and "unable to open" in text:
        return Unavailable(f"cannot open the metadata database: {text}", path)
    return GrabenError(f"metadata engine error: {text}", path)
