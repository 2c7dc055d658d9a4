"""The PostgreSQL engine's transactions: the repository's primitives as SQL.

``PostgresTx`` is what ``PostgresRepository.read()`` and ``write()`` yield
(see ``Tx`` in ``meta/_repo.py``), on one pooled connection; opening,
locking and committing the transaction is ``_postgres.py``'s. Rows become
values through the SQLite engine's decoders (``_sqlite_tx.py``): damage is
an ``IntegrityError`` naming the inode and path, never a wrong answer. A
call that touches many rows sends them as arrays (``unnest``): one round
trip to the server, not one per row.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from psycopg.pq import TransactionStatus

from ..._errors import IntegrityError
from ..._types import ChunkProblem, ChunkRef, Degraded, Extent, NodeState, ServiceState
from .._repo import (
    INODE_COLUMNS,
    NEW_INODE_COLUMNS,
    ROOT_INODE,
    ChunkRecord,
    Inode,
    Lease,
    NewFile,
    new_values,
)
from ._postgres_schema import Connection, inconsistencies
from ._rows import PAGE_ROWS_MAX, CheckedRows, checked_inode, chunk_ref, inode_of

MAX_DEPTH = 4096
"""Directories ``path_of`` climbs at most (a path is at most 4096 bytes)."""


_JOINED_INODE = ", ".join("i." + c for c in INODE_COLUMNS.split(", "))
_EXTENT_ROWS = (
    'SELECT x."offset", x.length, x.chunk, c.length, c.crc32c, x.chunk_offset '
    "FROM extents x LEFT JOIN chunks c ON c.id = x.chunk "
)

_ADD_EXTENTS = (
    "added AS (INSERT INTO extents "
    '(inode, "offset", length, chunk, chunk_offset) SELECT {inode}, * FROM '
    "unnest(%s::bigint[], %s::bigint[], %s::text[], %s::bigint[])), "
    "counted AS (UPDATE chunks c SET refs = c.refs + u.n "
    "FROM unnest(%s::text[], %s::bigint[]) AS u (id, n) WHERE c.id = u.id) "
)
"""A file's extents added, and a reference taken on each of their chunks (the last parts
of a ``WITH``; ``{inode}``: the file's number, or a query for it; parameters:
``_extent_arrays``)."""


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


class PostgresTx(CheckedRows):
    """A transaction on one pooled connection (see ``Tx`` in ``meta/_repo.py``)."""

    def __init__(self, db: Connection) -> None:
        self._db = db

    def _rows(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        return self._db.execute(query, params).fetchall()

    def _one(self, query: str, params: Any = None) -> tuple[Any, ...] | None:
        return self._db.execute(query, params).fetchone()

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        self._db.execute("SAVEPOINT unit")
        try:
            yield
        except BaseException:
            if _alive(self._db):  # a lost connection has no savepoint left to return to
                self._db.execute("ROLLBACK TO SAVEPOINT unit")
                self._db.execute("RELEASE SAVEPOINT unit")
            raise
        self._db.execute("RELEASE SAVEPOINT unit")

    # -- names and files -------------------------------------------------------

    def lookup(self, parent: int, name: str) -> Inode | None:
        return inode_of(
            self._one(
                f"SELECT {_JOINED_INODE} FROM entries e JOIN inodes i ON i.id = e.inode "
                "WHERE e.parent = %s AND e.name = %s",
                (parent, name),
            )
        )

    def get(self, inode: int) -> Inode | None:
        return inode_of(self._one(f"SELECT {INODE_COLUMNS} FROM inodes WHERE id = %s", (inode,)))

    def children(self, parent: int) -> list[tuple[str, Inode]]:
        rows = self._rows(
            f"SELECT e.name, {_JOINED_INODE} FROM entries e JOIN inodes i ON i.id = e.inode "
            "WHERE e.parent = %s ORDER BY e.name",
            (parent,),
        )
        return [(row[0], checked_inode(row[1:])) for row in rows]

    def children_page(self, parent: int, after: str, limit: int) -> list[tuple[str, Inode]]:
        rows = self._rows(
            f"SELECT e.name, {_JOINED_INODE} FROM entries e JOIN inodes i ON i.id = e.inode "
            "WHERE e.parent = %s AND e.name > %s ORDER BY e.name LIMIT %s",
            (parent, after, min(limit, PAGE_ROWS_MAX)),
        )
        return [(row[0], checked_inode(row[1:])) for row in rows]

    def has_children(self, parent: int) -> bool:
        return self._one("SELECT 1 FROM entries WHERE parent = %s LIMIT 1", (parent,)) is not None

    def create(self, node: Inode) -> Inode:
        row = self._one(
            f"INSERT INTO inodes ({NEW_INODE_COLUMNS}) VALUES ({', '.join(['%s'] * 12)}) "
            "RETURNING id",
            new_values(node),
        )
        assert row is not None
        return replace(node, id=row[0])

    def create_file(self, parent: int, name: str, file: NewFile) -> Inode:
        row = self._one(
            f"WITH node AS (INSERT INTO inodes ({NEW_INODE_COLUMNS}) "
            f"VALUES ({', '.join(['%s'] * 12)}) RETURNING id), "
            "named AS (INSERT INTO entries (parent, name, inode) SELECT %s, %s, id FROM node), "
            + _ADD_EXTENTS.format(inode="(SELECT id FROM node)")
            + "SELECT id FROM node",
            (*new_values(file.attributes), parent, name, *_extent_arrays(file.extents)),
        )
        assert row is not None
        return file.inode(row[0])

    def update(self, node: Inode) -> None:
        n = node
        self._db.execute(
            "UPDATE inodes SET mode = %s, mtime_ns = %s, atime_ns = %s, ctime_ns = %s, "
            "uid = %s, gid = %s WHERE id = %s",
            (n.mode, n.mtime_ns, n.atime_ns, n.ctime_ns, n.uid, n.gid, n.id),
        )

    def touch(self, inode: int, now_ns: int, *, links: int = 0, modified: bool = True) -> int:
        row = self._one(
            "UPDATE inodes SET ctime_ns = GREATEST(ctime_ns, %(now)s), "
            "nlink = nlink + %(links)s, "
            "mtime_ns = CASE WHEN %(modified)s THEN %(now)s ELSE mtime_ns END "
            "WHERE id = %(inode)s RETURNING nlink",
            {"now": now_ns, "links": links, "modified": modified, "inode": inode},
        )
        return int(row[0]) if row else 0

    def relink(self, old: int, new: int) -> None:
        self._db.execute("UPDATE entries SET inode = %s WHERE inode = %s", (new, old))

    def link(self, parent: int, name: str, inode: int) -> None:
        self._db.execute(
            "INSERT INTO entries (parent, name, inode) VALUES (%s, %s, %s)", (parent, name, inode)
        )

    def unlink(self, parent: int, name: str) -> None:
        self._db.execute("DELETE FROM entries WHERE parent = %s AND name = %s", (parent, name))

    def delete(self, inode: int) -> None:
        # One round trip: the extents go, their chunks lose a reference each, the inode goes.
        self._db.execute(
            "WITH gone AS (DELETE FROM extents WHERE inode = %(inode)s RETURNING chunk), "
            "node AS (DELETE FROM inodes WHERE id = %(inode)s), "
            "uses AS (SELECT chunk, COUNT(*) AS n FROM gone GROUP BY chunk) "
            "UPDATE chunks c SET refs = c.refs - u.n, zero_since_ns = "
            "CASE WHEN c.refs - u.n = 0 THEN %(now)s ELSE c.zero_since_ns END "
            "FROM uses u WHERE c.id = u.chunk",
            {"inode": inode, "now": time.time_ns()},
        )

    def extents(self, inode: int) -> list[Extent]:
        rows = self._rows(_EXTENT_ROWS + 'WHERE x.inode = %s ORDER BY x."offset"', (inode,))
        size = self._one("SELECT size FROM inodes WHERE id = %s", (inode,))
        return self._tiled(inode, [self._extent(inode, *row) for row in rows], size)

    def extents_page(self, inode: int, start: int, limit: int) -> list[Extent]:
        # The extent covering ``start`` begins at the greatest offset <= start;
        # that the pages tile the file is checked by whoever gathers them.
        rows = self._rows(
            _EXTENT_ROWS + 'WHERE x.inode = %(inode)s AND x."offset" >= COALESCE('
            '(SELECT MAX("offset") FROM extents WHERE inode = %(inode)s '
            'AND "offset" <= %(start)s), 0) ORDER BY x."offset" LIMIT %(limit)s',
            {"inode": inode, "start": start, "limit": min(limit, PAGE_ROWS_MAX)},
        )
        return [self._extent(inode, *row) for row in rows]

    def set_extents(self, inode: int, extents: Iterable[Extent]) -> None:
        self._db.execute(
            "WITH " + _ADD_EXTENTS.format(inode="%s") + "SELECT 1",
            (inode, *_extent_arrays(list(extents))),
        )

    # -- chunks -------------------------------------------------------------

    def add_chunks(self, chunks: Iterable[tuple[ChunkRef, tuple[str, ...]]]) -> None:
        chunks = list(chunks)
        held = [(c.id, node) for c, nodes in chunks for node in nodes]
        self._db.execute(
            "WITH added AS (INSERT INTO chunks (id, length, crc32c, refs, zero_since_ns) "
            "SELECT id, length, crc, 0, %s FROM "
            "unnest(%s::text[], %s::bigint[], %s::bigint[]) AS n (id, length, crc) "
            "ON CONFLICT DO NOTHING) "
            "INSERT INTO replicas (chunk, node) SELECT * FROM unnest(%s::text[], %s::text[]) "
            "ON CONFLICT DO NOTHING",
            (
                time.time_ns(),
                [c.id for c, _ in chunks],
                [c.length for c, _ in chunks],
                [c.crc32c for c, _ in chunks],
                [chunk for chunk, _ in held],
                [node for _, node in held],
            ),
        )

    def replicas(self, ids: Iterable[str]) -> dict[str, tuple[str, ...]]:
        rows = self._rows(
            "SELECT chunk, node FROM replicas WHERE chunk = ANY(%s) ORDER BY chunk, node",
            (list(ids),),
        )
        return _grouped(rows)

    def referenced(self, ids: Iterable[str]) -> dict[str, tuple[str, ...]]:
        rows = self._rows(
            "SELECT r.chunk, r.node FROM chunks c JOIN replicas r ON r.chunk = c.id "
            "WHERE c.refs > 0 AND c.id = ANY(%s) ORDER BY r.chunk, r.node",
            (list(ids),),
        )
        return _grouped(rows)

    def known(self, ids: Iterable[str]) -> set[str]:
        return {c for (c,) in self._rows("SELECT id FROM chunks WHERE id = ANY(%s)", (list(ids),))}

    def named(self, ids: Iterable[str]) -> set[str]:
        rows = self._rows(
            "SELECT id FROM chunks WHERE id = ANY(%(ids)s) "
            "UNION SELECT chunk FROM extents WHERE chunk = ANY(%(ids)s) "
            "UNION SELECT chunk FROM replicas WHERE chunk = ANY(%(ids)s)",
            {"ids": list(ids)},
        )
        return {c for (c,) in rows}

    def chunk_page(self, after: str, limit: int) -> tuple[list[ChunkRecord], str]:
        limit = min(limit, PAGE_ROWS_MAX)
        rows = self._rows(
            "SELECT c.id, c.length, c.crc32c, "
            "ARRAY(SELECT r.node FROM replicas r WHERE r.chunk = c.id ORDER BY r.node) "
            "FROM chunks c WHERE c.id > %s ORDER BY c.id LIMIT %s",
            (after, limit),
        )
        page = []
        for chunk, length, crc, nodes in rows:
            ref = chunk_ref(chunk, length, crc)
            if ref is not None:
                page.append((ref, tuple(nodes)))
        return page, rows[-1][0] if len(rows) == limit else ""

    def chunk_users(self, chunk: str, after: int, limit: int) -> list[int]:
        rows = self._rows(
            "SELECT DISTINCT inode FROM extents WHERE chunk = %s AND inode > %s "
            "ORDER BY inode LIMIT %s",
            (chunk, after, min(limit, PAGE_ROWS_MAX)),
        )
        return [inode for (inode,) in rows]

    def path_of(self, inode: int) -> str | None:
        names: list[str] = []
        while inode != ROOT_INODE:
            row = self._one("SELECT parent, name FROM entries WHERE inode = %s LIMIT 1", (inode,))
            if row is None or len(names) >= MAX_DEPTH:  # unlinked, or a damaged loop
                return None
            inode, name = row
            names.append(name)
        return "/" + "/".join(reversed(names))

    def forget_unreferenced(self, older_than_ns: int, limit: int) -> list[ChunkRecord]:
        # An extent naming the chunk means its refs count is wrong, not that it is free.
        rows = self._rows(
            "SELECT id, length, crc32c FROM chunks c WHERE refs = 0 AND zero_since_ns < %s "
            "AND NOT EXISTS (SELECT 1 FROM extents x WHERE x.chunk = c.id) ORDER BY id LIMIT %s",
            (older_than_ns, min(limit, PAGE_ROWS_MAX)),
        )
        gone = [ref for ref in (chunk_ref(*row) for row in rows) if ref is not None]
        ids = [ref.id for ref in gone]
        held = _grouped(
            sorted(self._rows("DELETE FROM replicas WHERE chunk = ANY(%s) RETURNING *", (ids,)))
        )
        self._db.execute("DELETE FROM chunks WHERE id = ANY(%s)", (ids,))
        return [(ref, held.get(ref.id, ())) for ref in gone]

    def inconsistencies(self, limit: int) -> list[ChunkProblem]:
        return inconsistencies(self._db, self.path_of, limit)

    def store_id(self) -> str:
        row = self._one("SELECT id FROM store")
        if row is None or not isinstance(row[0], str):
            raise IntegrityError("metadata damaged: the store's id is missing")
        return row[0]

    def add_replicas(self, chunk: str, nodes: Iterable[str]) -> None:
        self._db.execute(
            "INSERT INTO replicas (chunk, node) SELECT %s, * FROM unnest(%s::text[]) "
            "ON CONFLICT DO NOTHING",
            (chunk, list(nodes)),
        )

    def drop_replica(self, chunk: str, node: str) -> None:
        self._db.execute("DELETE FROM replicas WHERE chunk = %s AND node = %s", (chunk, node))

    def degraded(self, alive: Iterable[str], limit: int) -> list[Degraded]:
        rows = self._rows(
            "WITH live AS (SELECT unnest(%s::text[]) AS node), "
            "want AS (SELECT x.chunk, MAX(i.replication) AS copies FROM extents x "
            "JOIN inodes i ON i.id = x.inode GROUP BY x.chunk), "
            "have AS (SELECT r.chunk, array_agg(r.node ORDER BY r.node) AS nodes, "
            "COUNT(*) AS copies FROM replicas r JOIN live l ON l.node = r.node GROUP BY r.chunk) "
            "SELECT c.id, c.length, c.crc32c, h.nodes, w.copies FROM chunks c "
            "JOIN want w ON w.chunk = c.id LEFT JOIN have h ON h.chunk = c.id "
            "WHERE c.refs > 0 AND COALESCE(h.copies, 0) < w.copies LIMIT %s",
            (sorted(set(alive)), limit),
        )
        return [
            Degraded(ChunkRef(chunk, length, crc), tuple(nodes or ()), want)
            for chunk, length, crc, nodes, want in rows
        ]

    # -- idempotency keys ------------------------------------------------------

    def outcomes(self, keys: Iterable[str]) -> dict[str, bytes]:
        rows = self._rows("SELECT key, reply FROM outcomes WHERE key = ANY(%s)", (list(keys),))
        return {key: bytes(reply) for key, reply in rows}

    def record_outcomes(self, outcomes: Iterable[tuple[str, bytes]], made_ns: int) -> None:
        pairs = list(outcomes)
        self._db.execute(
            "INSERT INTO outcomes (key, made_ns, reply) "
            "SELECT key, %s, reply FROM unnest(%s::text[], %s::bytea[]) AS n (key, reply)",
            (made_ns, [key for key, _ in pairs], [reply for _, reply in pairs]),
        )

    def forget_outcomes(self, older_than_ns: int, limit: int) -> int:
        cur = self._db.execute(
            "DELETE FROM outcomes WHERE key IN (SELECT key FROM outcomes "
            "WHERE made_ns < %s ORDER BY made_ns LIMIT %s)",
            (older_than_ns, limit),
        )
        return cur.rowcount

    # -- nodes --------------------------------------------------------------

    def upsert_node(self, node: NodeState) -> None:
        self._db.execute(
            "INSERT INTO nodes (id, address, rack, free, total, last_seen) "
            "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET "
            "address = excluded.address, rack = excluded.rack, free = excluded.free, "
            "total = excluded.total, last_seen = excluded.last_seen",
            (node.id, node.address, node.rack, node.free, node.total, node.last_seen),
        )

    def nodes(self) -> list[NodeState]:
        rows = self._rows("SELECT id, address, rack, free, total, last_seen FROM nodes ORDER BY id")
        return [NodeState(*row) for row in rows]

    # -- metadata services, the lease, damaged copies -----------------------------

    def now(self) -> float:
        # The server's clock, not this host's: services on several hosts judge by one.
        row = self._one("SELECT extract(epoch FROM clock_timestamp())::float8")
        assert row is not None
        return float(row[0])

    def lease(self) -> Lease:
        row = self._one("SELECT holder, fence, expires FROM lease WHERE id = 1")
        if row is None:
            raise IntegrityError("metadata damaged: the leader's lease row is missing")
        return Lease(*row)

    def set_lease(self, lease: Lease) -> None:
        self._db.execute(
            "UPDATE lease SET holder = %s, fence = %s, expires = %s WHERE id = 1",
            (lease.holder, lease.fence, lease.expires),
        )

    def upsert_service(self, service: ServiceState) -> None:
        self._db.execute(
            "INSERT INTO services (id, address, engine, started, last_seen) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET "
            "address = excluded.address, last_seen = excluded.last_seen",
            (service.id, service.address, service.engine, service.started, service.last_seen),
        )

    def services(self) -> list[ServiceState]:
        rows = self._rows(
            "SELECT id, address, engine, started, last_seen FROM services ORDER BY id"
        )
        return [ServiceState(*row) for row in rows]

    def forget_services(self, ids: Iterable[str] = (), seen_before: float = 0.0) -> None:
        self._db.execute(
            "DELETE FROM services WHERE id = ANY(%s) OR last_seen < %s", (list(ids), seen_before)
        )

    def add_bad(self, chunk: str, node: str, reason: str) -> None:
        self._db.execute(
            "INSERT INTO bad_copies (chunk, node, reason) VALUES (%s, %s, %s) "
            "ON CONFLICT (chunk, node) DO UPDATE SET reason = excluded.reason",
            (chunk, node, reason),
        )

    def bad_copies(self, limit: int) -> list[tuple[str, str, str]]:
        rows = self._rows(
            "SELECT chunk, node, reason FROM bad_copies ORDER BY chunk, node LIMIT %s",
            (min(limit, PAGE_ROWS_MAX),),
        )
        return [(chunk, node, reason) for chunk, node, reason in rows]

    def bad_count(self) -> int:
        row = self._one("SELECT COUNT(*) FROM bad_copies")
        return int(row[0]) if row else 0

    def forget_bad(self, chunk: str, node: str) -> None:
        self._db.execute("DELETE FROM bad_copies WHERE chunk = %s AND node = %s", (chunk, node))


def _grouped(rows: Iterable[tuple[Any, ...]]) -> dict[str, tuple[str, ...]]:
    """``(chunk, node)`` rows, in order, as each chunk's nodes."""
    found: dict[str, list[str]] = {}
    for chunk, node in rows:
        found.setdefault(chunk, []).append(node)
    return {chunk: tuple(nodes) for chunk, nodes in found.items()}


def _alive(db: Connection) -> bool:
    """Whether the connection is still in a transaction the server knows."""
    return db.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR)
