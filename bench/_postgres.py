"""A throwaway PostgreSQL server: its own cluster in a temporary directory, never the system's.

``PgServer`` makes a cluster with ``initdb`` in a temporary directory and runs
it with ``pg_ctl`` on a free loopback port, fsync on. PostgreSQL refuses to
run as root, so as root it runs as the ``postgres`` OS user (the directory is
handed to it). Clients log in over TCP as the superuser ``graben`` with a
password. ``throwaway`` starts one for a block and says why it cannot where
PostgreSQL is missing. The bench measures the PostgreSQL engine on one; the
tests' ``pg_kit`` builds its fixtures on it.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ._kit import free_port

USER = "graben"
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

    def __init__(self, bindir: Path, *, listen: str = "127.0.0.1") -> None:
        self.bindir = bindir
        self.listen = listen
        """Addresses it listens on (``listen_addresses``): loopback, and for tests whose
        servers sit in network namespaces, their bridge's address too."""
        self.root = Path(tempfile.mkdtemp(prefix="graben-pg-"))
        self.data = self.root / "data"
        self.password = secrets.token_hex(16)
        self.port = 0
        self.settings: dict[str, str] = {}
        """More ``-c`` settings it starts with (``synchronous_standby_names``, say)."""
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
        with open(self.data / "pg_hba.conf", "a") as hba:  # hosts on our own subnets log in too
            hba.write("host all all samenet scram-sha-256\n")

    def start(self) -> None:
        """Start, on the port it had if it ran before, else on a free one (another, if
        that one was taken meanwhile)."""
        fresh = self.port == 0
        for attempt in range(3 if fresh else 1):
            self.port = free_port() if fresh else self.port
            options = (
                f"-p {self.port} -c listen_addresses='{self.listen}' "
                f"-c unix_socket_directories={self.root} -c fsync=on -c synchronous_commit=on "
                "-c shared_buffers=32MB -c max_connections=200 "
                # its dynamic shared memory in its data directory, not /dev/shm: a server
                # SIGKILLed (failover tests) would leave its segments there for good
                "-c dynamic_shared_memory_type=mmap"
                + "".join(f" -c {name}='{value}'" for name, value in self.settings.items())
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

    def standby(self, settings: dict[str, str] | None = None) -> PgServer:
        """A streaming standby of this server (``pg_basebackup -R``), started with
        ``settings``: it replays the primary's WAL, takes reads, and becomes a primary
        when ``promote``d. With ``synchronous_standby_names`` set on the primary, a commit
        waits for it."""
        other = PgServer(self.bindir, listen=self.listen)
        other.password = self.password  # the same cluster: the same superuser
        other.settings = dict(settings or {})
        try:
            self._run(
                *("env", f"PGPASSWORD={self.password}", str(self.bindir / "pg_basebackup")),
                *("-h", "127.0.0.1", "-p", str(self.port), "-U", USER, "-D", str(other.data)),
                *("-R", "-X", "stream", "-c", "fast"),
            )
            other.start()
        except BaseException:
            other.close()
            raise
        return other

    def promote(self) -> None:
        """``pg_ctl promote``: a standby becomes a primary (it waits until it takes writes)."""
        self._pg_ctl("promote")

    def processes(self) -> dict[int, str]:
        """The server's processes: the postmaster's pid and each child's, with its title
        (``postgres: walreceiver``, say)."""
        pid = int((self.data / "postmaster.pid").read_text().split()[0])
        found = {pid: "postmaster"}
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit() and _parent(proc) == pid:
                with contextlib.suppress(OSError):
                    found[int(proc.name)] = (proc / "cmdline").read_bytes().strip(b"\0").decode()
        return found

    def kill(self) -> None:
        """SIGKILL the server and all its processes at once, as a host that dies."""
        for pid in self.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

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


def _parent(proc: Path) -> int:
    """The parent pid of the process ``/proc/<pid>``, or 0 if it is gone."""
    try:
        return int((proc / "stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


class NoPostgres(Exception):
    """PostgreSQL cannot run here; the message says why."""


def start(*, listen: str = "127.0.0.1") -> PgServer:
    """A running server listening on ``listen``, or ``NoPostgres`` saying why there
    cannot be one."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise NoPostgres("psycopg is not installed (pip install -e '.[postgres]')") from None
    bindir = server_binaries()
    if bindir is None:
        raise NoPostgres("PostgreSQL is not installed (as root: apt-get install -y postgresql)")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        raise NoPostgres("running as root without runuser: PostgreSQL refuses to run as root")
    try:
        server = PgServer(bindir, listen=listen)
    except (KeyError, LookupError, OSError) as exc:  # no postgres user to run it as
        raise NoPostgres(f"cannot prepare a PostgreSQL directory: {exc}") from None
    try:
        server.init()
        server.start()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        server.close()
        raise NoPostgres(f"PostgreSQL did not start: {exc}") from None
    return server


@contextlib.contextmanager
def throwaway() -> Iterator[PgServer]:
    """A PostgreSQL server for the block, stopped and removed after it."""
    server = start()
    try:
        yield server
    finally:
        server.close()
