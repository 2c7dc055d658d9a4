"""The metadata engine's own failover, staged as a host's death: the bench's
``meta-failover`` workload and the tests run the same play.

A PostgreSQL primary whose every commit waits for a streaming standby
(``synchronous_standby_names``) serves a cluster of two metadata services and
three nodes, which name both servers in one multi-host URL and follow the one
that takes writes (``target_session_attrs=read-write``, which graben adds for a
URL of several hosts). Writers put files as fast as they can, and beside them a
bare psycopg client on the same URL inserts rows (the engine's own floor). The
primary's WAL sender stops for half a second (the standby falls behind: with an
asynchronous standby, files acknowledged then are lost), the primary's processes
are SIGKILLed at once, and the standby is promoted (``pg_ctl promote``), at once
or ``promote_after_s`` later, as an operator or Patroni's loop would.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from graben.store import GrabenError, connect
from graben.store.local import cluster_up, make_secret_file

from ._kit import environ
from ._postgres import USER, PgServer, start

RESUME_S = 10.0
"""How soon after the primary's death writes must go on (the issue's bound)."""
WRITERS = 4
LAG_S = 0.5
"""How long the primary stops sending its WAL just before it dies."""
SYNC_S = 30.0
"""How long a new standby may take to be in sync."""


@dataclass
class Pair:
    """A primary and its synchronous standby, and the database graben's cluster uses."""

    primary: PgServer
    standby: PgServer
    database: str = ""
    probe: str = ""
    """A database of its own for the bare psycopg client's rows."""

    def url(self, database: str = "") -> str:
        """Both servers in one ``postgresql://`` URL, primary first."""
        hosts = f"127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
        return f"postgresql://{USER}:{self.primary.password}@{hosts}/{database or self.database}"

    def close(self) -> None:
        self.standby.close()
        self.primary.close()


def sync_pair() -> Pair:
    """A primary and a synchronous standby, in sync (``NoPostgres`` if none can run)."""
    primary = start()
    try:
        primary.settings["synchronous_standby_names"] = "*"  # every commit waits for it
        primary.stop()
        primary.start()
        # A standby whose primary is gone tries to stream again every 5 s by default, and
        # a promotion asked for meanwhile may wait for that: ask every 0.2 s.
        standby = primary.standby({"wal_retrieve_retry_interval": "200ms"})
    except BaseException:
        primary.close()
        raise
    pair = Pair(primary, standby)
    try:
        _eventually(lambda: _in_sync(primary), SYNC_S, "the standby did not catch up")
        pair.database = primary.create_database()  # made on the standby too, through the WAL
        pair.probe = primary.create_database()
        primary.sql(pair.probe, "CREATE TABLE probe (n bigint)")
    except BaseException:
        pair.close()
        raise
    return pair


def _in_sync(primary: PgServer) -> bool:
    rows = primary.sql("postgres", "SELECT sync_state FROM pg_stat_replication")
    return rows == [("sync",)]


def _eventually(check: Callable[[], bool], seconds: float, failure: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{failure} within {seconds:.0f} s")
        time.sleep(0.05)


@dataclass
class Writes:
    """What writers were told: each stored path with its bytes, and when it was sent and
    acknowledged; the engine's probe rows' send and commit times."""

    acked: dict[str, tuple[bytes, float, float]] = field(default_factory=dict)
    probes: list[tuple[float, float]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def resumed(self, after: float) -> bool:
        """Whether a file and a probe row sent after ``after`` were both acknowledged."""
        with self.lock:
            return any(sent > after for _, sent, _ in self.acked.values()) and any(
                sent > after for sent, _ in self.probes
            )


def _writer(url: str, worker: int, writes: Writes, stop: threading.Event) -> None:
    with connect(url, timeout=20) as client:
        i = 0
        while not stop.is_set():
            path = f"/w{worker}/f{i}"
            # Mostly small files (their bytes in the engine), every fourth on the nodes.
            data = os.urandom(300_000 if i % 4 == 3 else 4096)
            sent = time.monotonic()
            try:
                client.put(path, data)
            except GrabenError:
                time.sleep(0.05)
            else:
                with writes.lock:
                    writes.acked[path] = (data, sent, time.monotonic())
            i += 1


def _prober(url: str, writes: Writes, stop: threading.Event) -> None:
    """Insert rows through psycopg alone, reconnecting as a plain client would."""
    import psycopg

    dsn = f"{url}?target_session_attrs=read-write&connect_timeout=2"
    conn = None
    n = 0
    while not stop.is_set():
        sent = time.monotonic()
        try:
            if conn is None:
                conn = psycopg.connect(dsn, autocommit=True)
            conn.execute("INSERT INTO probe VALUES (%s)", (n,))
        except psycopg.Error:
            if conn is not None:
                conn.close()
            conn = None
            time.sleep(0.05)
            continue
        with writes.lock:
            writes.probes.append((sent, time.monotonic()))
        n += 1
        time.sleep(0.01)
    if conn is not None:
        conn.close()


@dataclass(frozen=True)
class Outcome:
    resumed_s: float
    """From the primary's death to the first file sent after it and acknowledged."""
    engine_s: float
    """The same for the bare psycopg client's rows."""
    acked: int
    lost: list[str]
    """Acknowledged files not there, or not whole, afterwards."""


def failover(pair: Pair, root: Path, promote_after_s: float = 0.0) -> Outcome:
    """Write, kill the primary, promote the standby ``promote_after_s`` later, write on."""
    writes, stop = Writes(), threading.Event()
    root.mkdir(parents=True, exist_ok=True)
    secret = make_secret_file(root / "secret")
    with (
        environ({"GRABEN_SECRET_FILE": str(secret)}),
        cluster_up(
            root,
            3,
            secret,
            engine=pair.url(),
            services=2,
            extra=("--replication", "2", "--log-level", "error"),
        ) as url,
    ):
        threads = [
            threading.Thread(target=_writer, args=(url, w, writes, stop)) for w in range(WRITERS)
        ]
        threads.append(threading.Thread(target=_prober, args=(pair.url(pair.probe), writes, stop)))
        for thread in threads:
            thread.start()
        try:
            _eventually(lambda: len(writes.acked) >= 40, 60, "40 files were not written")
            # The standby falls behind (a slow link, a busy host: the primary's WAL sender
            # stalls), then the primary dies: what it acknowledged meanwhile must be on the
            # standby all the same.
            (sender,) = [
                pid for pid, title in pair.primary.processes().items() if "walsender" in title
            ]
            os.kill(sender, signal.SIGSTOP)
            time.sleep(LAG_S)
            pair.primary.kill()
            killed = time.monotonic()
            time.sleep(promote_after_s)
            pair.standby.promote()
            _eventually(
                lambda: writes.resumed(killed),
                RESUME_S * 3,
                "no file or no probe row was written after the promotion",
            )
            time.sleep(1.0)  # and on for a while
        finally:
            stop.set()
            for thread in threads:
                thread.join(60)
        resumed = min(acked for _, sent, acked in writes.acked.values() if sent > killed)
        engine = min(acked for sent, acked in writes.probes if sent > killed)
        lost = _lost(url, writes)
    return Outcome(resumed - killed, engine - killed, len(writes.acked), lost)


def _lost(url: str, writes: Writes) -> list[str]:
    lost = []
    with connect(url, timeout=20) as client:
        for path, (data, _, _) in sorted(writes.acked.items()):
            try:
                if client.get(path) != data:
                    lost.append(f"{path}: other bytes")
            except GrabenError as exc:
                lost.append(f"{path}: {exc}")
    return lost
