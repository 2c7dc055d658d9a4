"""The SQLite engine: one file, WAL, one durable transaction per mutation.

Several processes may share the database: SQLite's locks serialise writers
(``BEGIN IMMEDIATE`` takes the write lock up front, so two writers never
deadlock upgrading a read lock) and WAL lets readers run beside them.
Connections are per thread. The schema carries its version in
``PRAGMA user_version`` and is brought up to date by ``MIGRATIONS`` in one
exclusive transaction.

A database is created only when asked (``create=True``): a mistyped path or
an emptied file must not pass for a new, empty store. The files are the
owner's alone (0600). Rows are checked as they become values: damage in
the file is an ``IntegrityError`` naming the inode and path, never a wrong
answer.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ._errors import GrabenError, IntegrityError, NoSpace, NotFound, Unavailable
from ._repo import ROOT_INODE, ChunkRecord, Inode, tiling_problem
from ._sqlite_checks import inconsistencies
from ._types import ChunkProblem, ChunkRef, Degraded, Extent, Kind, NodeState


def _identity(db: sqlite3.Connection) -> None:
    """3: the store's id, made once, with the store (HDFS's clusterID)."""
    db.execute("CREATE TABLE store (id TEXT NOT NULL)")
    db.execute("INSERT INTO store (id) VALUES (?)", (uuid.uuid4().hex,))


MIGRATIONS: tuple[str | Callable[[sqlite3.Connection], None], ...] = (
    # 1: the three layers.
    f"""
    CREATE TABLE inodes (
        id INTEGER PRIMARY KEY,
        kind TEXT NOT NULL CHECK (kind IN ('file', 'directory')),
        size INTEGER NOT NULL,
        mode INTEGER NOT NULL,
        mtime_ns INTEGER NOT NULL,
        generation INTEGER NOT NULL,
        replication INTEGER NOT NULL
    );
    CREATE TABLE entries (
        parent INTEGER NOT NULL,
        name TEXT NOT NULL,
        inode INTEGER NOT NULL,
        PRIMARY KEY (parent, name)
    ) WITHOUT ROWID;
    CREATE INDEX entries_by_inode ON entries (inode);
    CREATE TABLE chunks (
        id TEXT PRIMARY KEY,
        length INTEGER NOT NULL,
        crc32c INTEGER NOT NULL,
        refs INTEGER NOT NULL DEFAULT 0,
        zero_since_ns INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX chunks_unreferenced ON chunks (zero_since_ns) WHERE refs = 0;
    CREATE TABLE extents (
        inode INTEGER NOT NULL,
        offset INTEGER NOT NULL,
        length INTEGER NOT NULL,
        chunk TEXT NOT NULL,
        chunk_offset INTEGER NOT NULL,
        PRIMARY KEY (inode, offset)
    ) WITHOUT ROWID;
    CREATE INDEX extents_by_chunk ON extents (chunk);
    CREATE TABLE replicas (
        chunk TEXT NOT NULL,
        node TEXT NOT NULL,
        PRIMARY KEY (chunk, node)
    ) WITHOUT ROWID;
    INSERT INTO inodes VALUES ({ROOT_INODE}, 'directory', 0, 493, 0, 1, 1);
    """,
    # 2: the data node registry (the metadata service keeps no state of its own).
    """
    CREATE TABLE nodes (
        id TEXT PRIMARY KEY,
        address TEXT NOT NULL,
        rack TEXT NOT NULL,
        free INTEGER NOT NULL,
        total INTEGER NOT NULL,
        last_seen REAL NOT NULL
    ) WITHOUT ROWID;
    """,
    _identity,
)

_INODE_COLUMNS = "id, kind, size, mode, mtime_ns, generation, replication"
BUSY_TIMEOUT_S = 60.0
FILE_MODE = 0o600
"""The database and its -wal and -shm files (SQLite gives those the database's mode)."""
PAGE_ROWS_MAX = 100_000
"""Rows one paged query returns at most, whatever it is asked (the wire's pages are far smaller)."""


def _inode(row: tuple[object, ...] | None) -> Inode | None:
    """A row of ``inodes`` as a value; ``IntegrityError`` if it does not decode."""
    if row is None:
        return None
    number, kind, *numbers = row
    if (
        type(number) is not int
        or kind not in ("file", "directory")
        or any(type(n) is not int for n in numbers)
    ):
        raise IntegrityError(f"metadata damaged: inode row {row!r} does not decode")
    return Inode(number, kind, *numbers)  # type: ignore[arg-type]


def _checked_inode(row: tuple[object, ...]) -> Inode:
    found = _inode(row)
    assert found is not None
    return found


def _chunk_ref(chunk: object, length: object, crc: object) -> ChunkRef | None:
    """A chunk row as a value, or ``None`` if it does not decode."""
    ok = (
        isinstance(chunk, str)
        and len(chunk) == 64
        and type(length) is int
        and length >= 0
        and type(crc) is int
    )
    return ChunkRef(chunk, length, crc) if ok else None  # type: ignore[arg-type]


class SQLiteTx:
    """A transaction on one connection (see ``Tx`` in ``_repo.py``)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def _damaged(self, inode: int, problem: str) -> IntegrityError:
        """The error for a file whose rows contradict each other, naming it."""
        where = self.path_of(inode) or f"inode {inode} (no path names it)"
        return IntegrityError(f"metadata damaged: {problem} (inode {inode})", where)

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        self._db.execute("SAVEPOINT unit")
        try:
            yield
        except BaseException:
            if self._db.in_transaction:  # a full disk rolls back everything by itself
                self._db.execute("ROLLBACK TO unit")
                self._db.execute("RELEASE unit")
            raise
        self._db.execute("RELEASE unit")

    # -- names and files -------------------------------------------------------

    def lookup(self, parent: int, name: str) -> Inode | None:
        return _inode(
            self._db.execute(
                f"SELECT {', '.join('i.' + c for c in _INODE_COLUMNS.split(', '))} "
                "FROM entries e JOIN inodes i ON i.id = e.inode "
                "WHERE e.parent = ? AND e.name = ?",
                (parent, name),
            ).fetchone()
        )

    def get(self, inode: int) -> Inode | None:
        return _inode(
            self._db.execute(
                f"SELECT {_INODE_COLUMNS} FROM inodes WHERE id = ?", (inode,)
            ).fetchone()
        )

    def children(self, parent: int) -> list[tuple[str, Inode]]:
        rows = self._db.execute(
            f"SELECT e.name, {', '.join('i.' + c for c in _INODE_COLUMNS.split(', '))} "
            "FROM entries e JOIN inodes i ON i.id = e.inode "
            "WHERE e.parent = ? ORDER BY e.name",
            (parent,),
        )
        return [(row[0], _checked_inode(row[1:])) for row in rows]

    def children_page(self, parent: int, after: str, limit: int) -> list[tuple[str, Inode]]:
        rows = self._db.execute(
            f"SELECT e.name, {', '.join('i.' + c for c in _INODE_COLUMNS.split(', '))} "
            "FROM entries e JOIN inodes i ON i.id = e.inode "
            "WHERE e.parent = ? AND e.name > ? ORDER BY e.name LIMIT ?",
            (parent, after, limit),
        )
        return [(row[0], Inode(*row[1:])) for row in rows]

    def has_children(self, parent: int) -> bool:
        row = self._db.execute("SELECT 1 FROM entries WHERE parent = ? LIMIT 1", (parent,))
        return row.fetchone() is not None

    def create(
        self, kind: Kind, size: int, mode: int, mtime_ns: int, generation: int, replication: int
    ) -> Inode:
        cur = self._db.execute(
            "INSERT INTO inodes (kind, size, mode, mtime_ns, generation, replication) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (kind, size, mode, mtime_ns, generation, replication),
        )
        assert cur.lastrowid is not None
        return Inode(cur.lastrowid, kind, size, mode, mtime_ns, generation, replication)

    def set_attributes(self, inode: int, mode: int, mtime_ns: int) -> Inode:
        self._db.execute(
            "UPDATE inodes SET mode = ?, mtime_ns = ? WHERE id = ?", (mode, mtime_ns, inode)
        )
        found = self.get(inode)
        assert found is not None
        return found

    def link(self, parent: int, name: str, inode: int) -> None:
        self._db.execute(
            "INSERT INTO entries (parent, name, inode) VALUES (?, ?, ?)", (parent, name, inode)
        )

    def unlink(self, parent: int, name: str) -> None:
        self._db.execute("DELETE FROM entries WHERE parent = ? AND name = ?", (parent, name))

    def delete(self, inode: int) -> None:
        uses = Counter(
            chunk
            for (chunk,) in self._db.execute("SELECT chunk FROM extents WHERE inode = ?", (inode,))
        )
        self._release(uses)
        self._db.execute("DELETE FROM extents WHERE inode = ?", (inode,))
        self._db.execute("DELETE FROM inodes WHERE id = ?", (inode,))

    def extents(self, inode: int) -> list[Extent]:
        rows = self._db.execute(
            "SELECT x.offset, x.length, x.chunk, c.length, c.crc32c, x.chunk_offset "
            "FROM extents x LEFT JOIN chunks c ON c.id = x.chunk "
            "WHERE x.inode = ? ORDER BY x.offset",
            (inode,),
        )
        extents = [self._extent(inode, *row) for row in rows]
        size = self._db.execute("SELECT size FROM inodes WHERE id = ?", (inode,)).fetchone()
        problem = tiling_problem(size[0] if size else 0, extents)
        if problem is not None:
            raise self._damaged(inode, f"{problem}; the file's size says {size and size[0]}")
        return extents

    def _extent(
        self, inode: int, offset: object, length: object, chunk: object, *rest: object
    ) -> Extent:
        """One ``extents`` row (joined with its chunk row) as a value, or ``IntegrityError``."""
        if not isinstance(chunk, str) or rest[0] is None:
            raise self._damaged(
                inode,
                f"the extent at offset {offset} names chunk {chunk!r}, which has no chunk row",
            )
        ref = _chunk_ref(chunk, *rest[:2])
        chunk_offset = rest[2]
        if (
            ref is None
            or type(offset) is not int
            or type(length) is not int
            or type(chunk_offset) is not int
        ):
            raise self._damaged(inode, f"the extent at offset {offset!r} does not decode")
        return Extent(offset, length, ref, chunk_offset)

    def extents_page(self, inode: int, start: int, limit: int) -> list[Extent]:
        # The extent covering ``start`` begins at the greatest offset <= start.
        # Rows are checked one by one here; that the pages tile the file is
        # checked by whoever gathers them (``_pages.py``).
        rows = self._db.execute(
            "SELECT x.offset, x.length, x.chunk, c.length, c.crc32c, x.chunk_offset "
            "FROM extents x LEFT JOIN chunks c ON c.id = x.chunk "
            "WHERE x.inode = ?1 AND x.offset >= COALESCE("
            "(SELECT MAX(offset) FROM extents WHERE inode = ?1 AND offset <= ?2), 0) "
            "ORDER BY x.offset LIMIT ?3",
            (inode, start, limit),
        )
        return [self._extent(inode, *row) for row in rows]

    def set_extents(self, inode: int, extents: Iterable[Extent]) -> None:
        extents = list(extents)
        self._db.executemany(
            "INSERT INTO extents (inode, offset, length, chunk, chunk_offset) "
            "VALUES (?, ?, ?, ?, ?)",
            [(inode, x.offset, x.length, x.chunk.id, x.chunk_offset) for x in extents],
        )
        self._db.executemany(
            "UPDATE chunks SET refs = refs + ? WHERE id = ?",
            [(n, chunk) for chunk, n in Counter(x.chunk.id for x in extents).items()],
        )

    def _release(self, uses: Counter[str]) -> None:
        now = time.time_ns()
        self._db.executemany(
            "UPDATE chunks SET refs = refs - ?1, "
            "zero_since_ns = CASE WHEN refs - ?1 = 0 THEN ?2 ELSE zero_since_ns END "
            "WHERE id = ?3",
            [(n, now, chunk) for chunk, n in uses.items()],
        )

    # -- chunks -------------------------------------------------------------

    def add_chunks(self, chunks: Iterable[tuple[ChunkRef, tuple[str, ...]]]) -> None:
        chunks = list(chunks)
        now = time.time_ns()
        self._db.executemany(
            "INSERT OR IGNORE INTO chunks (id, length, crc32c, refs, zero_since_ns) "
            "VALUES (?, ?, ?, 0, ?)",
            [(c.id, c.length, c.crc32c, now) for c, _ in chunks],
        )
        self._db.executemany(
            "INSERT OR IGNORE INTO replicas (chunk, node) VALUES (?, ?)",
            [(c.id, node) for c, nodes in chunks for node in nodes],
        )

    def _in(self, sql: str, ids: Iterable[str]) -> Iterator[tuple[str, ...]]:
        ids = list(ids)
        for start in range(0, len(ids), 500):
            batch = ids[start : start + 500]
            yield from self._db.execute(sql.format(",".join("?" * len(batch))), batch)

    def replicas(self, ids: Iterable[str]) -> dict[str, tuple[str, ...]]:
        found: dict[str, list[str]] = {}
        sql = "SELECT chunk, node FROM replicas WHERE chunk IN ({}) ORDER BY chunk, node"
        for chunk, node in self._in(sql, ids):
            found.setdefault(chunk, []).append(node)
        return {chunk: tuple(nodes) for chunk, nodes in found.items()}

    def referenced(self, ids: Iterable[str]) -> dict[str, tuple[str, ...]]:
        live = [c for (c,) in self._in("SELECT id FROM chunks WHERE refs > 0 AND id IN ({})", ids)]
        return self.replicas(live)

    def known(self, ids: Iterable[str]) -> set[str]:
        return {c for (c,) in self._in("SELECT id FROM chunks WHERE id IN ({})", ids)}

    def named(self, ids: Iterable[str]) -> set[str]:
        sql = (
            "SELECT id FROM chunks WHERE id IN ({0}) UNION SELECT chunk FROM extents "
            "WHERE chunk IN ({0}) UNION SELECT chunk FROM replicas WHERE chunk IN ({0})"
        )
        ids = list(ids)
        found: set[str] = set()
        for start in range(0, len(ids), 300):
            batch = ids[start : start + 300]
            marks = ",".join("?" * len(batch))
            found.update(c for (c,) in self._db.execute(sql.format(marks), batch * 3))
        return found

    def chunk_page(self, after: str, limit: int) -> tuple[list[ChunkRecord], str]:
        limit = min(limit, PAGE_ROWS_MAX)
        rows = self._db.execute(
            "SELECT c.id, c.length, c.crc32c, "
            "(SELECT group_concat(r.node) FROM replicas r WHERE r.chunk = c.id) "
            "FROM chunks c WHERE c.id > ? ORDER BY c.id LIMIT ?",
            (after, limit),
        ).fetchall()
        page = []
        for chunk, length, crc, nodes in rows:
            ref = _chunk_ref(chunk, length, crc)
            if ref is not None:
                page.append((ref, tuple(str(nodes).split(",")) if nodes else ()))
        last = rows[-1][0] if len(rows) == limit else ""
        return page, last if isinstance(last, str) else ""

    def chunk_users(self, chunk: str, after: int, limit: int) -> list[int]:
        rows = self._db.execute(
            "SELECT DISTINCT inode FROM extents WHERE chunk = ? AND inode > ? "
            "ORDER BY inode LIMIT ?",
            (chunk, after, min(limit, PAGE_ROWS_MAX)),
        )
        return [inode for (inode,) in rows]

    def path_of(self, inode: int) -> str | None:
        names: list[str] = []
        while inode != ROOT_INODE:
            row = self._db.execute(
                "SELECT parent, name FROM entries WHERE inode = ? LIMIT 1", (inode,)
            ).fetchone()
            if row is None:
                return None
            inode, name = row
            names.append(name)
        return "/" + "/".join(reversed(names))

    def forget_unreferenced(self, older_than_ns: int, limit: int) -> list[ChunkRecord]:
        # An extent naming the chunk means its refs count is wrong, not that it is free.
        rows = self._db.execute(
            "SELECT id, length, crc32c FROM chunks WHERE refs = 0 AND zero_since_ns < ? "
            "AND id NOT IN (SELECT chunk FROM extents) ORDER BY id LIMIT ?",
            (older_than_ns, min(limit, PAGE_ROWS_MAX)),
        ).fetchall()
        gone = [ref for ref in (_chunk_ref(*row) for row in rows) if ref is not None]
        held = self.replicas(ref.id for ref in gone)
        self._db.executemany("DELETE FROM chunks WHERE id = ?", [(r.id,) for r in gone])
        self._db.executemany("DELETE FROM replicas WHERE chunk = ?", [(r.id,) for r in gone])
        return [(ref, held.get(ref.id, ())) for ref in gone]

    def inconsistencies(self, limit: int) -> list[ChunkProblem]:
        return inconsistencies(self._db, self.path_of, limit)

    def store_id(self) -> str:
        row = self._db.execute("SELECT id FROM store").fetchone()
        if row is None or not isinstance(row[0], str):
            raise IntegrityError("metadata damaged: the store's id is missing")
        return row[0]

    def add_replicas(self, chunk: str, nodes: Iterable[str]) -> None:
        self._db.executemany(
            "INSERT OR IGNORE INTO replicas (chunk, node) VALUES (?, ?)",
            [(chunk, node) for node in nodes],
        )

    def drop_replica(self, chunk: str, node: str) -> None:
        self._db.execute("DELETE FROM replicas WHERE chunk = ? AND node = ?", (chunk, node))

    def degraded(self, alive: Iterable[str], limit: int) -> list[Degraded]:
        # One pass over referenced chunks; fine for now, an index of
        # "replicas per chunk" would be the next step for large stores.
        rows = self._db.execute(
            "WITH live AS (SELECT value AS node FROM json_each(?)), "
            "want AS (SELECT x.chunk, MAX(i.replication) AS copies FROM extents x "
            "JOIN inodes i ON i.id = x.inode GROUP BY x.chunk), "
            "have AS (SELECT r.chunk, group_concat(r.node) AS nodes, COUNT(*) AS copies "
            "FROM replicas r JOIN live l ON l.node = r.node GROUP BY r.chunk) "
            "SELECT c.id, c.length, c.crc32c, h.nodes, w.copies FROM chunks c "
            "JOIN want w ON w.chunk = c.id LEFT JOIN have h ON h.chunk = c.id "
            "WHERE c.refs > 0 AND COALESCE(h.copies, 0) < w.copies LIMIT ?",
            (json.dumps(sorted(set(alive))), limit),
        ).fetchall()
        return [
            Degraded(ChunkRef(chunk, length, crc), tuple(nodes.split(",")) if nodes else (), want)
            for chunk, length, crc, nodes, want in rows
        ]

    # -- nodes --------------------------------------------------------------

    def upsert_node(self, node: NodeState) -> None:
        self._db.execute(
            "INSERT INTO nodes (id, address, rack, free, total, last_seen) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
            "address = excluded.address, rack = excluded.rack, free = excluded.free, "
            "total = excluded.total, last_seen = excluded.last_seen",
            (node.id, node.address, node.rack, node.free, node.total, node.last_seen),
        )

    def nodes(self) -> list[NodeState]:
        rows = self._db.execute(
            "SELECT id, address, rack, free, total, last_seen FROM nodes ORDER BY id"
        )
        return [NodeState(*row) for row in rows]


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

    def __init__(self, path: str | Path, *, create: bool = True) -> None:
        """Open the engine at ``path``; with ``create``, make a new store if there is none.

        Without ``create``, a missing file, or one holding no schema (0 bytes,
        say), is ``NotFound`` and is left as it was.
        """
        self.path = str(path)
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        if create:
            _make_private(self.path)
        else:
            _require_schema(self.path)
        try:
            self._migrate()
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
            except sqlite3.DatabaseError as exc:
                raise _translate(exc, self.path) from exc
            self._local.db = db
            with self._lock:
                self._all.append(db)
        return db

    def _migrate(self) -> None:
        try:
            self._apply_migrations()
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from exc

    def _apply_migrations(self) -> None:
        with self._transaction("BEGIN EXCLUSIVE") as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > len(MIGRATIONS):
                raise GrabenError(
                    f"the store's schema is version {version}, newer than this graben "
                    f"understands ({len(MIGRATIONS)}); upgrade graben",
                    self.path,
                )
            if version == 0 and _has_tables(db):
                raise IntegrityError(
                    "this database holds something else, not a graben store", self.path
                )
            for number, step in enumerate(MIGRATIONS[version:], start=version + 1):
                if callable(step):
                    step(db)
                else:
                    for statement in step.split(";"):
                        if statement.strip():
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
    def read(self) -> Iterator[SQLiteTx]:
        try:
            with self._transaction("BEGIN DEFERRED") as db:
                yield SQLiteTx(db)
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from exc

    @contextmanager
    def write(self) -> Iterator[SQLiteTx]:
        try:
            with self._transaction("BEGIN IMMEDIATE") as db:
                yield SQLiteTx(db)
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from exc

    def close(self) -> None:
        with self._lock:
            for db in self._all:
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
    if "not a database" in text or "malformed" in text:
        return IntegrityError(f"metadata database is damaged or not a graben store: {text}", path)
    if isinstance(exc, sqlite3.OperationalError) and "unable to open" in text:
        return Unavailable(f"cannot open the metadata database: {text}", path)
    return GrabenError(f"metadata engine error: {text}", path)
