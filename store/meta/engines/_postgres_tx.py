"""The PostgreSQL engine's transactions: the shared queries, and many rows in one statement.

``postgres_tx`` makes what ``PostgresRepository.read()`` and ``transact()``
give (``SqlTx``, see ``Tx`` in ``meta/_repo.py``), on one pooled connection
(``PostgresStatements``); opening, locking and committing the transaction is
``_postgres.py``'s. The queries are the concerns' (``_sql_tx.py``), which
PostgreSQL takes as written. Where the server is across a network, its own
class for a concern (``PostgresTree``, ``PostgresFiles``, ``PostgresChunks``,
``PostgresKeys``) overrides what touches many rows: it sends them as arrays
(``unnest``) in one statement, and a new file or a deleted one is one
statement, not one per table: one round trip each. ``PostgresServices`` reads
the server's clock, and the lease locked in a write.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from psycopg.pq import TransactionStatus

from ..._errors import IntegrityError
from ..._types import ChunkProblem, Extent, StoredChunk
from .._repo import NEW_INODE_COLUMNS, ROOT_INODE, Conflict, Inode, Lease, NewFile, new_values
from ._postgres_schema import Connection, inconsistencies
from ._rows import PathOf, check_entry, checked_inode, named_entry
from ._sql_chunks import SqlChunks
from ._sql_files import SqlFiles, check_counted
from ._sql_records import SqlKeys, SqlServices
from ._sql_tree import JOINED_INODE, LOCK_TRIES, SqlTree
from ._sql_tx import Parts, SqlTx
from ._statements import Statements

TREE_LOCK = 0x67726162656F
"""The advisory lock a directory's move holds (``lock_tree``)."""

_ADD_EXTENTS = (
    "added AS (INSERT INTO extents "
    '(inode, "offset", length, chunk, chunk_offset) SELECT {inode}, * FROM '
    "unnest(%s::bigint[], %s::bigint[], %s::text[], %s::bigint[])), "
    "counted AS (UPDATE chunks c SET refs = c.refs + u.n "
    "FROM unnest(%s::text[], %s::bigint[]) AS u (id, n) WHERE c.id = u.id RETURNING 1) "
)
"""A file's extents added, and a reference taken on each of their chunks (the last parts
of a ``WITH``; ``{inode}``: the file's number, or a query for it; parameters:
``_extent_arrays``). ``SELECT COUNT(*) FROM counted``: the chunk rows counted."""
_ADD_MANY_EXTENTS = _ADD_EXTENTS.replace(
    "SELECT {inode}, * FROM unnest(", "SELECT * FROM unnest(%s::bigint[], "
)
"""``_ADD_EXTENTS`` for the extents of many files: each extent's inode is in an array
before ``_extent_arrays``'s."""


def _extent_arrays(extents: Sequence[Extent]) -> tuple[list[Any], ...]:
    """``_ADD_EXTENTS``'s parameters: the extents' columns, then each chunk's uses."""
    uses = Counter(x.chunk.id for x in extents)
    return (
        [x.offset for x in extents],
        [x.length for x in extents],
        [x.chunk.id for x in extents],
        [x.chunk_offset for x in extents],
        list(uses),
        list(uses.values()),
    )


class PostgresStatements(Statements):
    """One pooled connection's statements, as written."""

    def __init__(self, db: Connection) -> None:
        self.db = db

    def execute(self, query: str, params: Any = None) -> Any:
        return self.db.execute(query, params)

    def many(self, query: str, rows: Sequence[Any]) -> int:
        if not rows:
            return 0
        with self.db.cursor() as cur:  # psycopg pipelines them: one round trip
            cur.executemany(query, rows)
            return cur.rowcount

    def in_transaction(self) -> bool:
        return alive(self.db)

    def inconsistencies(self, path_of: PathOf, limit: int) -> list[ChunkProblem]:
        return inconsistencies(self.db, path_of, limit)


class PostgresTree(SqlTree):
    """The tree with a path in one query, names locked in one, and moves taking turns."""

    def walk(self, parts: Sequence[str]) -> list[Inode]:
        # One round trip for the whole path, not one per name.
        if len(parts) < 2:
            return super().walk(parts)
        rows = self.sql.rows(
            "WITH RECURSIVE down (depth, id, kind, parent, name, sum) AS ("
            f"SELECT 0, {ROOT_INODE}::bigint, 'directory'::text, 0::bigint, "
            "''::text COLLATE \"C\", 0::bigint UNION ALL "
            "SELECT d.depth + 1, e.inode, i.kind, e.parent, e.name, e.sum FROM down d "
            "JOIN entries e ON e.parent = d.id AND e.name = (%(parts)s::text[])[d.depth + 1] "
            "LEFT JOIN inodes i ON i.id = e.inode "
            "WHERE d.kind = 'directory' AND d.depth < %(depth)s) "
            f"SELECT d.parent, d.name, d.sum, d.id, {JOINED_INODE} FROM down d "
            "LEFT JOIN inodes i ON i.id = d.id "
            "WHERE d.depth > 0 ORDER BY d.depth",
            {"parts": list(parts), "depth": len(parts)},
        )
        return [named_entry(row[0], row[1], row[2:], self.path_of) for row in rows]

    def locked_entries(self, names: Sequence[tuple[int, str]]) -> dict[tuple[int, str], Inode]:
        # Two round trips for any number of names: lock the inodes they name, then read the
        # names again (one may have moved, or gone and been replaced, meanwhile).
        if len(names) < 2:
            return super().locked_entries(names)
        wanted = ([parent for parent, _ in names], [name for _, name in names])
        for _ in range(LOCK_TRIES):
            rows = self.sql.rows(
                f"SELECT w.parent, w.name, {JOINED_INODE} FROM "
                "unnest(%s::bigint[], %s::text[]) AS w (parent, name) "
                "JOIN entries e ON e.parent = w.parent AND e.name = w.name "
                "JOIN inodes i ON i.id = e.inode FOR UPDATE OF i",
                wanted,
            )
            named = self.sql.rows(
                "SELECT w.parent, w.name, e.inode, e.sum FROM "
                "unnest(%s::bigint[], %s::text[]) AS w (parent, name) "
                "JOIN entries e ON e.parent = w.parent AND e.name = w.name",
                wanted,
            )
            locked = {(row[0], row[1]): checked_inode(row[2:], self.path_of) for row in rows}
            for parent, name, inode, total in named:
                check_entry(parent, name, inode, total, self.path_of)
            if {(p, n): i for p, n, i, _ in named} == {k: v.id for k, v in locked.items()}:
                return locked
        raise Conflict("the names a commit replaces kept changing")

    def lock_tree(self) -> None:
        self.sql.execute("SELECT pg_advisory_xact_lock(%s)", (TREE_LOCK,))


class PostgresFiles(SqlFiles):
    """Files made and deleted in one statement each, numbered by the server."""

    def create_file(self, parent: int, name: str, file: NewFile) -> Inode:
        row = self.sql.one(
            f"WITH node AS (INSERT INTO inodes ({NEW_INODE_COLUMNS}) "
            f"VALUES ({', '.join(['%s'] * 12)}) RETURNING id), "
            "named AS (INSERT INTO entries (parent, name, inode) SELECT %s, %s, id FROM node), "
            + _ADD_EXTENTS.format(inode="(SELECT id FROM node)")
            + "SELECT (SELECT id FROM node), (SELECT COUNT(*) FROM counted)",
            (*new_values(file.attributes), parent, name, *_extent_arrays(file.extents)),
        )
        assert row is not None
        check_counted(row[1], len({x.chunk.id for x in file.extents}))
        return file.inode(row[0])

    def create_files(self, files: Sequence[tuple[int, str, NewFile]]) -> list[Inode]:
        # Two round trips for any number: their numbers, then one statement for every table.
        if len(files) < 2:
            return super().create_files(files)
        numbers = self.new_ids(len(files))
        rows = [(n, *new_values(f.attributes)) for n, (_, _, f) in zip(numbers, files, strict=True)]
        extents = [x for _, _, f in files for x in f.extents]
        owners = [n for n, (_, _, f) in zip(numbers, files, strict=True) for _ in f.extents]
        row = self.sql.one(
            "WITH node AS (INSERT INTO inodes (id, " + NEW_INODE_COLUMNS + ") SELECT * FROM "
            "unnest(%s::bigint[], %s::text[], %s::bigint[], %s::bigint[], %s::bigint[], "
            "%s::bigint[], %s::bigint[], %s::bigint[], %s::bigint[], %s::bigint[], "
            "%s::bigint[], %s::bigint[], %s::bigint[])), "
            "named AS (INSERT INTO entries (parent, name, inode) "
            "SELECT * FROM unnest(%s::bigint[], %s::text[], %s::bigint[])), "
            + _ADD_MANY_EXTENTS
            + "SELECT COUNT(*) FROM counted",
            (
                *(list(column) for column in zip(*rows, strict=True)),
                [parent for parent, _, _ in files],
                [name for _, name, _ in files],
                numbers,
                owners,
                *_extent_arrays(extents),
            ),
        )
        assert row is not None
        check_counted(row[0], len({x.chunk.id for x in extents}))
        return [f.inode(n) for n, (_, _, f) in zip(numbers, files, strict=True)]

    def new_ids(self, count: int) -> list[int]:
        rows = self.sql.rows(
            "SELECT nextval(pg_get_serial_sequence('inodes', 'id')) FROM generate_series(1, %s)",
            (count,),
        )
        return [number for (number,) in rows]

    def delete(self, inode: int) -> None:
        # One round trip: the extents go, their chunks lose a reference each, the inode goes.
        self.sql.execute(
            "WITH gone AS (DELETE FROM extents WHERE inode = %(inode)s RETURNING chunk), "
            "node AS (DELETE FROM inodes WHERE id = %(inode)s), "
            "uses AS (SELECT chunk, COUNT(*) AS n FROM gone GROUP BY chunk) "
            "UPDATE chunks c SET refs = c.refs - u.n, zero_since_ns = "
            "CASE WHEN c.refs - u.n = 0 THEN %(now)s ELSE c.zero_since_ns END "
            "FROM uses u WHERE c.id = u.chunk",
            {"inode": inode, "now": time.time_ns()},
        )

    def set_extents(self, inode: int, extents: Iterable[Extent]) -> None:
        extents = list(extents)
        row = self.sql.one(
            "WITH " + _ADD_EXTENTS.format(inode="%s") + "SELECT COUNT(*) FROM counted",
            (inode, *_extent_arrays(extents)),
        )
        assert row is not None
        check_counted(row[0], len({x.chunk.id for x in extents}))


class PostgresChunks(SqlChunks):
    """New chunks recorded in one statement."""

    def add_chunks(self, chunks: Iterable[StoredChunk]) -> None:
        chunks = list(chunks)
        held = [(s.chunk.id, node) for s in chunks for node in s.nodes]
        kept = [(s.chunk.id, s.data) for s in chunks if s.data is not None]
        self.sql.execute(
            "WITH added AS (INSERT INTO chunks (id, length, crc32c, refs, zero_since_ns) "
            "SELECT id, length, crc, 0, %s FROM "
            "unnest(%s::text[], %s::bigint[], %s::bigint[]) AS n (id, length, crc) "
            "ON CONFLICT DO NOTHING), "
            "kept AS (INSERT INTO chunk_bytes (id, data) "
            "SELECT * FROM unnest(%s::text[], %b::bytea[]) ON CONFLICT DO NOTHING) "
            "INSERT INTO replicas (chunk, node) SELECT * FROM unnest(%s::text[], %s::text[]) "
            "ON CONFLICT DO NOTHING",
            (
                time.time_ns(),
                [s.chunk.id for s in chunks],
                [s.chunk.length for s in chunks],
                [s.chunk.crc32c for s in chunks],
                [chunk for chunk, _ in kept],
                [data for _, data in kept],
                [chunk for chunk, _ in held],
                [node for _, node in held],
            ),
        )


class PostgresKeys(SqlKeys):
    """Many keys' replies recorded in one statement."""

    def record_outcomes(self, outcomes: Iterable[tuple[str, bytes]], made_ns: int) -> None:
        pairs = list(outcomes)
        self.sql.execute(
            "INSERT INTO outcomes (key, made_ns, reply) "
            "SELECT key, %s, reply FROM unnest(%s::text[], %b::bytea[]) AS n (key, reply)",
            (made_ns, [key for key, _ in pairs], [reply for _, reply in pairs]),
        )


class PostgresServices(SqlServices):
    """The lease held from a write's read of it to its commit; the server's clock."""

    def __init__(self, sql: Statements, *, writing: bool = False) -> None:
        super().__init__(sql)
        self.writing = writing

    def now(self) -> float:
        # The server's clock, not this host's: services on several hosts judge by one.
        row = self.sql.one("SELECT extract(epoch FROM clock_timestamp())::float8")
        assert row is not None
        return float(row[0])

    def schema_version(self) -> int:
        row = self.sql.one("SELECT version FROM schema_version")
        assert row is not None
        return int(row[0])

    def lease(self) -> Lease:
        # Read to be changed or relied on (a fenced write): held till the commit.
        lock = " FOR UPDATE" if self.writing else ""
        row = self.sql.one("SELECT holder, fence, expires FROM lease WHERE id = 1" + lock)
        if row is None:
            raise IntegrityError("metadata damaged: the leader's lease row is missing")
        return Lease(*row)


READING = Parts(
    tree=PostgresTree,
    files=PostgresFiles,
    chunks=PostgresChunks,
    keys=PostgresKeys,
    services=PostgresServices,
)
"""The concerns PostgreSQL does its own way, in a read."""
WRITING = replace(READING, services=partial(PostgresServices, writing=True))
"""The same in a write: the lease read is locked."""


def postgres_tx(db: Connection, *, writing: bool = False) -> SqlTx:
    """A transaction on ``db``, which has begun one (see ``Tx`` in ``meta/_repo.py``)."""
    return SqlTx(PostgresStatements(db), WRITING if writing else READING)


def alive(db: Connection) -> bool:
    """Whether the connection is still in a transaction the server knows."""
    return db.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR)
