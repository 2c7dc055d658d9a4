"""Backups of a metadata engine, taken while its services serve, and restores from them.

SQLite: SQLite's online backup API copies the database in one step under one
read transaction, so the copy is one committed state; in WAL mode the
services' writers go on meanwhile. The copy is one self-contained file
(rollback journal, no ``-wal``). PostgreSQL: ``pg_dump`` in its custom format,
which reads the whole database in one REPEATABLE READ transaction (one
snapshot, however long the dump takes) while other sessions go on writing;
``pg_restore`` brings it back into an empty database.

Call order of a backup: ``hold`` (a committed row in the live store, so the
snapshot holds it too), then the copy. The hold keeps collection off every
chunk unreferenced after it was taken until it runs out, so a file the backup
names keeps its chunks even when it is deleted after the backup. A restore
copies the backup into the engine, then ``mark_restored``: the restored store
drops that backup's own hold and remembers when it was taken, so fsck knows
the chunk files written since for orphans as expected (``client/_fsck.py``).
The store's id is the backup's, the one the data nodes already carry.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from ..._config import child_environment
from ..._errors import GrabenError, InvalidArgument, NotFound, Unavailable
from .._repo import Repository, Tx
from ._optional import open_postgres
from ._postgres_url import display_url, is_postgres
from ._sqlite import BUSY_TIMEOUT_S, SQLiteRepository, _uri

DEFAULT_KEEP_S = 7 * 24 * 3600.0
"""How long a backup holds collection off the chunks its files may need."""


@dataclass(frozen=True, slots=True)
class Backup:
    """A backup taken, or restored."""

    path: Path
    """The backup's file."""
    store_id: str
    """The store it is of."""
    taken_ns: int
    """When it was taken (its hold's start), ns since the epoch."""
    until_ns: int
    """When its hold on collection runs out (0 for a restore)."""


def sqlite_path(engine: str) -> Path:
    """The file of a ``sqlite:///path`` engine."""
    parts = urlsplit(engine)
    if parts.scheme != "sqlite" or not parts.path:
        raise InvalidArgument(
            f"not an engine: {engine!r} (sqlite:///path/to/meta.db or postgresql://...)"
        )
    return Path("/" + unquote(parts.path).lstrip("/"))  # sqlite:////abs and sqlite:///abs


def _open(engine: str, *, migrate: bool) -> Repository:
    """The store in ``engine``; migrated only if ``migrate`` (never under running services,
    which run their own schema)."""
    if is_postgres(engine):
        return open_postgres(engine, create=False, migrate=migrate)
    return SQLiteRepository(sqlite_path(engine), create=False, migrate=migrate)


def backup(engine: str, out: Path, *, keep_s: float = DEFAULT_KEEP_S) -> Backup:
    """Back up the store in ``engine`` into ``out`` while its services serve."""
    if not keep_s > 0:
        raise InvalidArgument(f"a backup must hold collection off for more than 0 s, not {keep_s}")
    if out.exists():
        raise InvalidArgument("the backup file exists already; name a new one", str(out))
    if not out.parent.is_dir():
        raise NotFound("no such directory for the backup", str(out.parent))
    taken = time.time_ns()
    until = taken + int(keep_s * 1e9)
    repo = _open(engine, migrate=False)
    try:
        store_id = repo.transact(lambda tx: _hold(tx, f"{out.name}@{taken}", taken, until))
    finally:
        repo.close()
    partial = out.with_name(out.name + ".partial")
    partial.unlink(missing_ok=True)
    if is_postgres(engine):
        _pg_run("pg_dump", "--format=custom", f"--file={partial}", engine)
    else:
        _sqlite_copy(sqlite_path(engine), partial)
    _durable(partial)
    partial.rename(out)
    return Backup(out, store_id, taken, until)


def _hold(tx: Tx, name: str, taken: int, until: int) -> str:
    tx.identity.hold(name, taken, until)
    return tx.identity.store_id()


def restore(engine: str, source: Path, *, replace: bool = False) -> Backup:
    """Restore the store in ``source`` (a ``backup``) into ``engine``, which must hold no
    store (``replace``, SQLite only: set the one there aside, beside it). Its services
    must be stopped."""
    if not source.is_file():
        raise NotFound("no backup here", str(source))
    if is_postgres(engine):
        if replace:
            raise InvalidArgument(
                "--replace is for SQLite: restore into a new, empty PostgreSQL database"
            )
        _pg_restore(engine, source)
    else:
        _sqlite_restore(sqlite_path(engine), source, replace=replace)
    repo = _open(engine, migrate=True)  # its services are stopped: brought up to date
    try:
        store_id, taken = repo.transact(_mark_restored)
    finally:
        repo.close()
    return Backup(source, store_id, taken, 0)


def _mark_restored(tx: Tx) -> tuple[str, int]:
    return tx.identity.store_id(), tx.identity.mark_restored()


# -- SQLite --------------------------------------------------------------------------------


def _sqlite_copy(source: Path, out: Path) -> None:
    """Copy a live database in one step (one read transaction: one committed state)."""
    if not source.is_file():
        raise NotFound("no graben metadata database here", str(source))
    src = sqlite3.connect(_uri(str(source), "rw"), uri=True, timeout=BUSY_TIMEOUT_S)
    try:
        os.close(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        dst = sqlite3.connect(out)
        try:
            src.backup(dst)
            dst.execute("PRAGMA journal_mode = DELETE")
            (verdict,) = dst.execute("PRAGMA quick_check").fetchone()
        finally:
            dst.close()
    except sqlite3.Error as exc:
        raise GrabenError(f"the backup failed: {exc}", str(source)) from exc
    finally:
        src.close()
    if verdict != "ok":
        raise GrabenError(f"the backup copy does not check: {verdict}", str(out))


def _sqlite_restore(target: Path, source: Path, *, replace: bool) -> None:
    if target.exists() and target.stat().st_size > 0:
        if not replace:
            raise InvalidArgument(
                "a metadata database is here already: stop its service, then give --replace "
                "to set it aside (it is renamed, not deleted)",
                str(target),
            )
        stamp = time.strftime("%Y%m%dT%H%M%S")
        for suffix in ("", "-wal", "-shm"):
            old = Path(f"{target}{suffix}")
            if old.exists():
                old.rename(f"{target}.replaced-{stamp}{suffix}")
    target.parent.mkdir(0o700, parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".restoring")
    partial.unlink(missing_ok=True)
    _sqlite_copy(source, partial)
    _durable(partial)
    partial.rename(target)


def _durable(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- PostgreSQL ----------------------------------------------------------------------------


def _pg_restore(engine: str, source: Path) -> None:
    from ._postgres_schema import open_database

    where = display_url(engine)
    with open_database(engine, where, create=True) as db:
        found = db.execute("SELECT 1 FROM pg_tables WHERE schemaname = 'public' LIMIT 1")
        if found.fetchone() is not None:
            raise InvalidArgument(
                "this database holds tables already: restore into a new, empty database "
                "(createdb NAME), then point the services at it",
                where,
            )
    _pg_run(
        "pg_restore",
        "--no-owner",
        "--no-privileges",
        "--exit-on-error",
        "--single-transaction",
        str(source),
        engine,
    )


def _pg_run(tool: str, *args: str) -> None:
    """Run ``pg_dump`` or ``pg_restore``; the engine URL (last) goes as ``--dbname``
    without its password, which goes in the environment (never on a command line)."""
    *rest, engine = args
    program = shutil.which(tool)
    if program is None:
        raise Unavailable(f"{tool} is not installed (PostgreSQL's client tools: postgresql-client)")
    parts = urlsplit(engine)
    password = parts.password or dict(parse_qsl(parts.query)).get("password")
    env = child_environment(**({} if password is None else {"PGPASSWORD": unquote(password)}))
    where = display_url(engine)
    done = subprocess.run(
        [program, *rest, f"--dbname={where}"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        text = done.stderr.strip().replace(password or "\0", "***")
        raise GrabenError(f"{tool} failed: {text}", where)
