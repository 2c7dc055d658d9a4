"""A throwaway PostgreSQL server for the tests: never the system's service.

``PgServer`` makes a cluster of its own with ``initdb`` in a temporary
directory and runs it with ``pg_ctl`` on a free loopback port, fsync on.
PostgreSQL refuses to run as root, so as root it runs as the ``postgres``
OS user (the directory is handed to it). The session fixture ``pg_server``
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

import atexit
import contextlib
import glob
import hashlib
import os
import secrets
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from ranks_kit import free_port

from graben.store._types import ChunkRef, Extent, FileCommit, StoredChunk
from graben.store.meta._namespace import Namespace

USER = "graben"
MIGRATIONS = 4
"""The schema version graben writes today."""
START_TIMEOUT_S = 60


def server_binaries() -> Path | None:
    """The directory of ``initdb``, ``pg_ctl`` and ``postgres``, if PostgreSQL is installed."""
    found = shutil.which("initdb")
    candidates = [Path(found).resolve().parent] if found else []
    candidates += [Path(p).parent for p in sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))]
    for bindir in candidates:
        if all((bindir / tool).exists() for tool in ("initdb", "pg_ctl", "postgres")):
            return bindir
    return None


class PgServer:
    """One PostgreSQL cluster in a temporary directory, on 127.0.0.1."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="graben-pg-"))
        self.data = self.root / "data"
        self.password = secrets.token_hex(16)
        self.port = 0
        self._as: tuple[str, ...] = ()
        if os.geteuid() == 0:  # postgres will not run as root: hand it the directory
            self._as = ("runuser", "-u", "postgres", "--")
            shutil.chown(self.root, "postgres", "postgres")
        atexit.register(self.close)  # a session killed by Ctrl-C still stops its server

    def _run(self, *argv: str, timeout: float = START_TIMEOUT_S) -> None:
        done = subprocess.run(
            [*self._as, *argv], capture_output=True, text=True, timeout=timeout, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{Path(argv[0]).name} failed: {(done.stderr or done.stdout)[-800:]}"
            )

    def init(self) -> None:
        """``initdb``: a new cluster whose superuser ``graben`` logs in with a password."""
        pwfile = self.root / "pw"
        pwfile.write_text(self.password + "\n")
        if self._as:
            shutil.chown(pwfile, "postgres", "postgres")
        pwfile.chmod(0o600)
        self._run(
            str(self.bindir / "initdb"),
            *("-D", str(self.data), "-U", USER, f"--pwfile={pwfile}"),
            *("-E", "UTF8", "--locale=C.UTF-8", "--auth-local=trust"),
            "--auth-host=scram-sha-256",
        )
        pwfile.unlink()

    def start(self) -> None:
        """Start, on the port it had if it ran before, else on a free one (another, if
        that one was taken meanwhile)."""
        fresh = self.port == 0
        for attempt in range(3 if fresh else 1):
            self.port = free_port() if fresh else self.port
            options = (
                f"-p {self.port} -c listen_addresses=127.0.0.1 "
                f"-c unix_socket_directories={self.root} -c fsync=on -c synchronous_commit=on "
                "-c shared_buffers=32MB -c max_connections=200"
            )
            try:
                self._pg_ctl("start", "-o", options)
                return
            except RuntimeError:
                if attempt == 2 or not fresh:
                    raise

    def _pg_ctl(self, action: str, *args: str) -> None:
        log = self.root / "server.log"
        self._run(
            str(self.bindir / "pg_ctl"),
            *(action, "-D", str(self.data), "-l", str(log), "-w", "-t", str(START_TIMEOUT_S)),
            *args,
        )

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every connection is cut, the server is back at once."""
        self._pg_ctl("restart", "-m", "fast")

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop``; nothing if it is not running."""
        if (self.data / "postmaster.pid").exists():
            self._pg_ctl("stop", "-m", mode)

    def close(self) -> None:
        """Stop the server and remove its directory."""
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
        atexit.unregister(self.close)

    def url(self, database: str, *, password: bool = True) -> str:
        """A ``postgresql://`` URL of ``database`` on this server."""
        secret = f":{self.password}" if password else ""
        return f"postgresql://{USER}{secret}@127.0.0.1:{self.port}/{database}"

    def admin(self) -> Any:
        """An autocommit connection to the ``postgres`` database, as the superuser."""
        import psycopg

        return psycopg.connect(self.url("postgres"), autocommit=True)

    def create_database(self) -> str:
        """A new, empty database; its name. It sorts text as most servers do, by language
        (ICU's en-US: "a" < "B" < "b"), so a query that must sort by code point and does
        not say so fails here."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        with self.admin() as conn:
            conn.execute(
                f'CREATE DATABASE "{name}" TEMPLATE template0 ENCODING UTF8 '
                "LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'"
            )
        return name

    def drop_database(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def sql(self, database: str, statement: str, *params: object) -> list[tuple[Any, ...]]:
        """Run one statement in ``database`` behind graben's back; its rows."""
        import psycopg

        with psycopg.connect(self.url(database), autocommit=True) as conn:
            cur = conn.execute(statement, params or None)
            return cur.fetchall() if cur.description else []


def _start() -> PgServer:
    """A running server, or ``pytest.skip`` saying why there cannot be one."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg is not installed (pip install -e '.[postgres]')")
    bindir = server_binaries()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (as root: apt-get install -y postgresql)")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("running as root without runuser: PostgreSQL refuses to run as root")
    try:
        server = PgServer(bindir)
    except (KeyError, LookupError, OSError) as exc:  # no postgres user to run it as
        pytest.skip(f"cannot prepare a PostgreSQL directory: {exc}")
    try:
        server.init()
        server.start()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        server.close()
        pytest.skip(f"PostgreSQL did not start: {exc}")
    return server


@pytest.fixture(scope="session", name="pg_server")
def pg_server_fixture() -> Iterator[PgServer]:
    """A PostgreSQL server for the session, stopped and removed after it."""
    server = _start()
    try:
        yield server
    finally:
        server.close()


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
    """A commit of a file made of ``chunks`` in order, each stored on ``nodes``."""
    extents, at = [], 0
    for c in chunks:
        extents.append(Extent(at, c.length, c, 0))
        at += c.length
    stored = tuple(StoredChunk(c, nodes) for c in {c.id: c for c in chunks}.values())
    return FileCommit(path, tuple(extents), stored, **kw)  # type: ignore[arg-type]


def refs(engine: Engine, c: ChunkRef) -> int:
    """The reference count the engine keeps for a chunk."""
    return int(engine.sql("SELECT refs FROM chunks WHERE id = %s", c.id)[0][0])


def names(ns: Namespace, path: str) -> list[str]:
    """The names in a directory, in the order listed."""
    return [e.path.rsplit("/", 1)[1] for e in ns.listdir(path, limit=1000).entries]
