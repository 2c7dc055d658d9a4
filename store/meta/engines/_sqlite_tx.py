"""The SQLite engine's transactions: the repository's primitives as SQL.

``SQLiteTx`` is what ``SQLiteRepository.read()`` and ``write()`` yield (see
``Tx`` in ``meta/_repo.py``). Rows are checked as they become values:
damage in the file is an ``IntegrityError`` naming the inode and path, never
a wrong answer.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import cast

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
from ._rows import PAGE_ROWS_MAX, CheckedRows, checked_inode, chunk_ref, inode_of
from ._sqlite_checks import inconsistencies

_JOINED_INODE = ", ".join("i." + c for c in INODE_COLUMNS.split(", "))


class SQLiteTx(CheckedRows):
    """A transaction on one connection (see ``Tx`` in ``_repo.py``)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

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
        return inode_of(
            self._db.execute(
                f"SELECT {_JOINED_INODE} "
                "FROM entries e JOIN inodes i ON i.id = e.inode "
                "WHERE e.parent = ? AND e.name = ?",
                (parent, name),
            ).fetchone()
        )

    def get(self, inode: int) -> Inode | None:
        return inode_of(
            self._db.execute(
                f"SELECT {INODE_COLUMNS} FROM inodes WHERE id = ?", (inode,)
            ).fetchone()
        )

    def children(self, parent: int) -> list[tuple[str, Inode]]:
        rows = self._db.execute(
            f"SELECT e.name, {_JOINED_INODE} "
            "FROM entries e JOIN inodes i ON i.id = e.inode "
            "WHERE e.parent = ? ORDER BY e.name",
            (parent,),
        )
        return [(row[0], checked_inode(row[1:])) for row in rows]

    def children_page(self, parent: int, after: str, limit: int) -> list[tuple[str, Inode]]:
        rows = self._db.execute(
            f"SELECT e.name, {_JOINED_INODE} "
            "FROM entries e JOIN inodes i ON i.id = e.inode "
            "WHERE e.parent = ? AND e.name > ? ORDER BY e.name LIMIT ?",
            (parent, after, limit),
        )
        return [(row[0], checked_inode(row[1:])) for row in rows]

    def has_children(self, parent: int) -> bool:
        row = self._db.execute("SELECT 1 FROM entries WHERE parent = ? LIMIT 1", (parent,))
        return row.fetchone() is not None

    def create(self, node: Inode) -> Inode:
        cur = self._db.execute(
            f"INSERT INTO inodes ({NEW_INODE_COLUMNS}) VALUES ({', '.join('?' * 12)})",
            new_values(node),
        )
        assert cur.lastrowid is not None
        return replace(node, id=cur.lastrowid)

    def create_file(self, parent: int, name: str, file: NewFile) -> Inode:
        node = self.create(file.attributes)
        self.set_extents(node.id, file.extents)
        self.link(parent, name, node.id)
        return node

    def update(self, node: Inode) -> None:
        n = node
        self._db.execute(
            "UPDATE inodes SET mode = ?, mtime_ns = ?, atime_ns = ?, ctime_ns = ?, uid = ?, "
            "gid = ? WHERE id = ?",
            (n.mode, n.mtime_ns, n.atime_ns, n.ctime_ns, n.uid, n.gid, n.id),
        )

    def touch(self, inode: int, now_ns: int, *, links: int = 0, modified: bool = True) -> int:
        row = self._db.execute(
            "UPDATE inodes SET ctime_ns = max(ctime_ns, ?1), nlink = nlink + ?2, "
            "mtime_ns = CASE WHEN ?3 THEN ?1 ELSE mtime_ns END WHERE id = ?4 RETURNING nlink",
            (now_ns, links, modified, inode),
        ).fetchone()
        return int(row[0]) if row else 0

    def relink(self, old: int, new: int) -> None:
        self._db.execute("UPDATE entries SET inode = ? WHERE inode = ?", (new, old))

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
        size = self._db.execute("SELECT size FROM inodes WHERE id = ?", (inode,)).fetchone()
        return self._tiled(inode, [self._extent(inode, *row) for row in rows], size)

    def extents_page(self, inode: int, start: int, limit: int) -> list[Extent]:
        # The extent covering ``start`` begins at the greatest offset <= start.
        # Rows are checked one by one here; that the pages tile the file is
        # checked by whoever gathers them (``client/_pages.py``).
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
            ref = chunk_ref(chunk, length, crc)
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
        gone = [ref for ref in (chunk_ref(*row) for row in rows) if ref is not None]
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

    # -- idempotency keys ------------------------------------------------------

    def outcomes(self, keys: Iterable[str]) -> dict[str, bytes]:
        sql = "SELECT key, reply FROM outcomes WHERE key IN ({})"
        return {key: bytes(cast(bytes, reply)) for key, reply in self._in(sql, keys)}

    def record_outcomes(self, outcomes: Iterable[tuple[str, bytes]], made_ns: int) -> None:
        self._db.executemany(
            "INSERT INTO outcomes (key, made_ns, reply) VALUES (?, ?, ?)",
            [(key, made_ns, reply) for key, reply in outcomes],
        )

    def forget_outcomes(self, older_than_ns: int, limit: int) -> int:
        cur = self._db.execute(
            "DELETE FROM outcomes WHERE key IN (SELECT key FROM outcomes "
            "WHERE made_ns < ? ORDER BY made_ns LIMIT ?)",
            (older_than_ns, limit),
        )
        return cur.rowcount

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

    # -- metadata services, the lease, damaged copies -----------------------------

    def now(self) -> float:
        # Every process sharing the file runs on its host: its clock is the engine's.
        return time.time()

    def lease(self) -> Lease:
        row = self._db.execute("SELECT holder, fence, expires FROM lease WHERE id = 1").fetchone()
        if row is None:
            raise IntegrityError("metadata damaged: the leader's lease row is missing")
        return Lease(*row)

    def set_lease(self, lease: Lease) -> None:
        self._db.execute(
            "UPDATE lease SET holder = ?, fence = ?, expires = ? WHERE id = 1",
            (lease.holder, lease.fence, lease.expires),
        )

    def upsert_service(self, service: ServiceState) -> None:
        self._db.execute(
            "INSERT INTO services (id, address, engine, started, last_seen) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
            "address = excluded.address, last_seen = excluded.last_seen",
            (service.id, service.address, service.engine, service.started, service.last_seen),
        )

    def services(self) -> list[ServiceState]:
        rows = self._db.execute(
            "SELECT id, address, engine, started, last_seen FROM services ORDER BY id"
        )
        return [ServiceState(*row) for row in rows]

    def forget_services(self, ids: Iterable[str] = (), seen_before: float = 0.0) -> None:
        self._db.executemany("DELETE FROM services WHERE id = ?", [(i,) for i in ids])
        self._db.execute("DELETE FROM services WHERE last_seen < ?", (seen_before,))

    def add_bad(self, chunk: str, node: str, reason: str) -> None:
        self._db.execute(
            "INSERT INTO bad_copies (chunk, node, reason) VALUES (?, ?, ?) "
            "ON CONFLICT (chunk, node) DO UPDATE SET reason = excluded.reason",
            (chunk, node, reason),
        )

    def bad_copies(self, limit: int) -> list[tuple[str, str, str]]:
        rows = self._db.execute(
            "SELECT chunk, node, reason FROM bad_copies ORDER BY chunk, node LIMIT ?",
            (min(limit, PAGE_ROWS_MAX),),
        )
        return [(chunk, node, reason) for chunk, node, reason in rows]

    def bad_count(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM bad_copies").fetchone()[0])

    def forget_bad(self, chunk: str, node: str) -> None:
        self._db.execute("DELETE FROM bad_copies WHERE chunk = ? AND node = ?", (chunk, node))
