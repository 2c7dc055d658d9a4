"""The repository's records beside the tree, as SQL written once for every engine.

Each class is one concern of ``meta/_repo_records.py`` over a transaction's
``Statements``: ``SqlKeys`` (idempotency keys and their replies), ``SqlFeed`` (the change
feed), ``SqlNodes`` (the data nodes), ``SqlServices`` (the metadata services, the leader's
lease, the clock), ``SqlBadCopies`` (copies reported damaged) and ``SqlIdentity`` (the
store's id and its sealing). PostgreSQL records many keys in one statement
(``PostgresKeys``) and judges by its server's clock (``PostgresServices``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from ..._errors import IntegrityError
from ..._types import ChunkRef, NodeState, PathChange, ServiceState
from .._repo import Lease
from ._rows import PAGE_ROWS_MAX, chunk_ref
from ._statements import Statements


class SqlKeys:
    """Idempotency keys and their replies (see ``Keys`` in ``meta/_repo_records.py``)."""

    def __init__(self, sql: Statements) -> None:
        self.sql = sql

    def outcomes(self, keys: Iterable[str]) -> dict[str, bytes]:
        rows = self.sql.rows("SELECT key, reply FROM outcomes WHERE key = ANY(%s)", (list(keys),))
        return {key: bytes(reply) for key, reply in rows}

    def record_outcomes(self, outcomes: Iterable[tuple[str, bytes]], made_ns: int) -> None:
        self.sql.many(
            "INSERT INTO outcomes (key, made_ns, reply) VALUES (%s, %s, %s)",
            [(key, made_ns, reply) for key, reply in outcomes],
        )

    def forget_outcomes(self, older_than_ns: int, limit: int) -> int:
        return forget_oldest(self.sql, "outcomes", "key", older_than_ns, limit)


class SqlFeed:
    """The change feed (see ``ChangeFeed`` in ``meta/_repo_records.py``)."""

    def __init__(self, sql: Statements) -> None:
        self.sql = sql

    def record_changes(self, changes: Sequence[tuple[str, int, int]], made_ns: int) -> None:
        self.sql.many(
            "INSERT INTO changes (made_ns, path, inode, ctime_ns) VALUES (%s, %s, %s, %s)",
            [(made_ns, path, inode, ctime) for path, inode, ctime in changes],
        )

    def forget_changes(self, older_than_ns: int, limit: int) -> int:
        return forget_oldest(self.sql, "changes", "seq", older_than_ns, limit)

    def changes_after(self, after: int, missing: Sequence[int], limit: int) -> list[PathChange]:
        rows = self.sql.rows(
            "SELECT seq, path, inode, ctime_ns FROM changes WHERE seq > %s OR seq = ANY(%s) "
            "ORDER BY seq LIMIT %s",
            (after, list(missing), min(limit, PAGE_ROWS_MAX)),
        )
        return [PathChange(*row) for row in rows]

    def change_bounds(self) -> tuple[int, int]:
        row = self.sql.one("SELECT MIN(seq), MAX(seq) FROM changes")
        return (int(row[0] or 0), int(row[1] or 0)) if row else (0, 0)


class SqlNodes:
    """The data nodes (see ``Nodes`` in ``meta/_repo_records.py``)."""

    def __init__(self, sql: Statements) -> None:
        self.sql = sql

    def upsert_node(self, node: NodeState) -> None:
        self.sql.execute(
            "INSERT INTO nodes (id, address, rack, free, total, last_seen, stored, scrubbed, "
            "metrics) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE "
            "SET address = excluded.address, rack = excluded.rack, free = excluded.free, "
            "total = excluded.total, last_seen = excluded.last_seen, "
            "stored = excluded.stored, scrubbed = excluded.scrubbed, metrics = excluded.metrics",
            (
                *(node.id, node.address, node.rack, node.free, node.total, node.last_seen),
                *(node.stored, node.scrubbed, node.metrics),
            ),
        )

    def nodes(self) -> list[NodeState]:
        rows = self.sql.rows(
            "SELECT id, address, rack, free, total, last_seen, stored, scrubbed, state, metrics "
            "FROM nodes ORDER BY id"
        )
        return [
            NodeState(
                *(id_, address, rack, free, total, seen),
                stored=stored,
                scrubbed=scrubbed,
                state=state,
                metrics=metrics,
            )
            for id_, address, rack, free, total, seen, stored, scrubbed, state, metrics in rows
        ]

    def set_node_state(self, node: str, state: str) -> bool:
        query = "UPDATE nodes SET state = %s WHERE id = %s RETURNING id"
        return bool(self.sql.rows(query, (state, node)))

    def held(self) -> dict[str, int]:
        rows = self.sql.rows(
            "SELECT node, COUNT(*) FROM (SELECT node FROM replicas UNION ALL "
            "SELECT node FROM pieces WHERE node != '') h GROUP BY node"
        )
        return {node: int(count) for node, count in rows}

    def copies_on(self, node: str, limit: int) -> dict[str, tuple[str, ...]]:
        rows = self.sql.rows(
            "SELECT r.chunk, r.node FROM replicas r WHERE r.chunk IN "
            "(SELECT chunk FROM replicas WHERE node = %s ORDER BY chunk LIMIT %s) "
            "ORDER BY r.chunk, r.node",
            (node, min(limit, PAGE_ROWS_MAX)),
        )
        found: dict[str, tuple[str, ...]] = {}
        for chunk, holder in rows:
            found[chunk] = (*found.get(chunk, ()), holder)
        return found

    def sole(self, node: str, limit: int) -> list[str]:
        rows = self.sql.rows(
            "SELECT chunk FROM replicas r WHERE node = %s AND NOT EXISTS "
            "(SELECT 1 FROM replicas o WHERE o.chunk = r.chunk AND o.node != r.node) "
            "UNION SELECT piece FROM pieces WHERE node = %s ORDER BY 1 LIMIT %s",
            (node, node, min(limit, PAGE_ROWS_MAX)),
        )
        return [chunk for (chunk,) in rows]

    def held_bytes(self) -> dict[str, int]:
        rows = self.sql.rows(
            "SELECT r.node, SUM(c.length) FROM replicas r JOIN chunks c ON c.id = r.chunk "
            "GROUP BY r.node UNION ALL "
            "SELECT node, SUM(length) FROM pieces WHERE node != '' GROUP BY node"
        )
        found: dict[str, int] = {}
        for node, size in rows:
            found[node] = found.get(node, 0) + int(size or 0)
        return found

    def movable(self, src: str, dst: str, limit: int) -> list[ChunkRef]:
        rows = self.sql.rows(
            "SELECT c.id, c.length, c.crc32c, c.sum FROM replicas r "
            "JOIN chunks c ON c.id = r.chunk WHERE r.node = %s AND c.refs > 0 AND NOT EXISTS "
            "(SELECT 1 FROM replicas o WHERE o.chunk = r.chunk AND o.node = %s) "
            "ORDER BY c.id LIMIT %s",
            (src, dst, min(limit, PAGE_ROWS_MAX)),
        )
        # A row that fails its checksum is left to fsck.
        return [ref for ref in (chunk_ref(*row) for row in rows) if ref is not None]

    def forget_node(self, node: str) -> None:
        self.sql.execute("DELETE FROM replicas WHERE node = %s", (node,))
        self.sql.execute("UPDATE pieces SET node = '' WHERE node = %s", (node,))
        self.sql.execute("DELETE FROM nodes WHERE id = %s", (node,))


class SqlServices:
    """Services, the lease, the clock (see ``Services`` in ``meta/_repo_records.py``)."""

    def __init__(self, sql: Statements) -> None:
        self.sql = sql

    def now(self) -> float:
        # Every process sharing an engine on one host runs by its clock.
        return time.time()

    def lease(self) -> Lease:
        row = self.sql.one("SELECT holder, fence, expires FROM lease WHERE id = 1")
        if row is None:
            raise IntegrityError("metadata damaged: the leader's lease row is missing")
        return Lease(*row)

    def set_lease(self, lease: Lease) -> None:
        self.sql.execute(
            "UPDATE lease SET holder = %s, fence = %s, expires = %s WHERE id = 1",
            (lease.holder, lease.fence, lease.expires),
        )

    def upsert_service(self, service: ServiceState) -> None:
        s = service
        self.sql.execute(
            "INSERT INTO services (id, address, engine, started, last_seen, schema_version, "
            "metrics) VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET "
            "address = excluded.address, last_seen = excluded.last_seen, "
            "metrics = excluded.metrics",
            (s.id, s.address, s.engine, s.started, s.last_seen, s.schema_version, s.metrics),
        )

    def services(self) -> list[ServiceState]:
        rows = self.sql.rows(
            "SELECT id, address, engine, started, last_seen, schema_version, metrics "
            "FROM services ORDER BY id"
        )
        return [
            ServiceState(id_, address, engine, started, seen, version, metrics=metrics)
            for id_, address, engine, started, seen, version, metrics in rows
        ]

    def forget_services(self, ids: Iterable[str] = (), seen_before: float = 0.0) -> None:
        self.sql.execute(
            "DELETE FROM services WHERE id = ANY(%s) OR last_seen < %s", (list(ids), seen_before)
        )

    def schema_version(self) -> int:
        # SQLite's place for it; PostgreSQL keeps it in a table (``PostgresServices``).
        row = self.sql.one("PRAGMA user_version")
        assert row is not None
        return int(row[0])


class SqlBadCopies:
    """Copies reported damaged (see ``BadCopies`` in ``meta/_repo_records.py``)."""

    def __init__(self, sql: Statements) -> None:
        self.sql = sql

    def add_bad(self, chunk: str, node: str, reason: str) -> None:
        self.sql.execute(
            "INSERT INTO bad_copies (chunk, node, reason) VALUES (%s, %s, %s) "
            "ON CONFLICT (chunk, node) DO UPDATE SET reason = excluded.reason",
            (chunk, node, reason),
        )

    def bad_copies(self, limit: int) -> list[tuple[str, str, str]]:
        rows = self.sql.rows(
            "SELECT chunk, node, reason FROM bad_copies ORDER BY chunk, node LIMIT %s",
            (min(limit, PAGE_ROWS_MAX),),
        )
        return [(chunk, node, reason) for chunk, node, reason in rows]

    def bad_count(self) -> int:
        row = self.sql.one("SELECT COUNT(*) FROM bad_copies")
        return int(row[0]) if row else 0

    def forget_bad(self, chunk: str, node: str) -> None:
        self.sql.execute("DELETE FROM bad_copies WHERE chunk = %s AND node = %s", (chunk, node))


class SqlIdentity:
    """The store's id and its sealing (see ``Identity`` in ``meta/_repo_records.py``)."""

    def __init__(self, sql: Statements) -> None:
        self.sql = sql

    def store_id(self) -> str:
        row = self.sql.one("SELECT id FROM store")
        if row is None or not isinstance(row[0], str):
            raise IntegrityError("metadata damaged: the store's id is missing")
        return row[0]

    def sealed(self) -> str:
        row = self.sql.one("SELECT sealed FROM store")
        if row is None or not isinstance(row[0], str):
            raise IntegrityError("metadata damaged: the store's record of encryption is missing")
        return row[0]

    def seal(self, check: str) -> str:
        self.sql.execute("UPDATE store SET sealed = %s WHERE sealed = ''", (check,))
        return self.sealed()

    def hold(self, name: str, taken_ns: int, until_ns: int) -> None:
        self.sql.execute(
            "INSERT INTO backups (name, taken_ns, until_ns) VALUES (%s, %s, %s)",
            (name, taken_ns, until_ns),
        )

    def restored_ns(self) -> int:
        row = self.sql.one("SELECT restored_ns FROM store")
        return int(row[0]) if row else 0

    def mark_restored(self) -> int:
        row = self.sql.one("SELECT name, taken_ns FROM backups ORDER BY taken_ns DESC LIMIT 1")
        if row is None:
            return 0
        self.sql.execute("DELETE FROM backups WHERE name = %s", (row[0],))
        self.sql.execute("UPDATE store SET restored_ns = %s", (row[1],))
        return int(row[1])


def held_since(sql: Statements, now_ns: int) -> int | None:
    """When the oldest backup still holding collection off at ``now_ns`` was taken."""
    row = sql.one("SELECT MIN(taken_ns) FROM backups WHERE until_ns > %s", (now_ns,))
    return None if row is None or row[0] is None else int(row[0])


def forget_oldest(sql: Statements, table: str, key: str, older_than_ns: int, limit: int) -> int:
    """Delete up to ``limit`` rows of ``table`` made before ``older_than_ns``, oldest
    first; how many went."""
    cur = sql.execute(
        f"DELETE FROM {table} WHERE {key} IN (SELECT {key} FROM {table} "
        "WHERE made_ns < %s ORDER BY made_ns LIMIT %s)",
        (older_than_ns, limit),
    )
    return int(cur.rowcount)
