"""The repository's records beside the namespace, as SQL written once for every engine.

``SqlRecords`` is the half of ``SqlTx`` (``_sql_tx.py``) that keeps what
is not names, files or chunks: idempotency keys and their replies, the data
nodes, the metadata services, the leader's lease and the copies reported
damaged. It also holds the statement primitives both halves run on; the
engine's subclass gives ``_execute`` and ``_many`` for its connection.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from ..._errors import IntegrityError
from ..._types import NodeState, PathChange, ServiceState
from .._repo import Lease
from ._rows import PAGE_ROWS_MAX


class SqlRecords:
    """Keys, nodes, services, the lease and damaged copies (see ``Tx`` in ``meta/_repo.py``)."""

    def _execute(self, query: str, params: Any = None) -> Any:
        """Run one statement; its cursor."""
        raise NotImplementedError

    def _many(self, query: str, rows: Sequence[Any]) -> int:
        """Run one statement for each parameter row; how many rows they changed."""
        raise NotImplementedError

    def _rows(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        return list(self._execute(query, params).fetchall())

    def _one(self, query: str, params: Any = None) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = self._execute(query, params).fetchone()
        return row

    # -- idempotency keys ------------------------------------------------------

    def outcomes(self, keys: Iterable[str]) -> dict[str, bytes]:
        rows = self._rows("SELECT key, reply FROM outcomes WHERE key = ANY(%s)", (list(keys),))
        return {key: bytes(reply) for key, reply in rows}

    def record_outcomes(self, outcomes: Iterable[tuple[str, bytes]], made_ns: int) -> None:
        self._many(
            "INSERT INTO outcomes (key, made_ns, reply) VALUES (%s, %s, %s)",
            [(key, made_ns, reply) for key, reply in outcomes],
        )

    def forget_outcomes(self, older_than_ns: int, limit: int) -> int:
        return self._forget_oldest("outcomes", "key", older_than_ns, limit)

    def _forget_oldest(self, table: str, key: str, older_than_ns: int, limit: int) -> int:
        """Delete up to ``limit`` rows of ``table`` made before ``older_than_ns``, oldest
        first; how many went."""
        cur = self._execute(
            f"DELETE FROM {table} WHERE {key} IN (SELECT {key} FROM {table} "
            "WHERE made_ns < %s ORDER BY made_ns LIMIT %s)",
            (older_than_ns, limit),
        )
        return int(cur.rowcount)

    # -- the change feed ---------------------------------------------------------

    def record_changes(self, changes: Sequence[tuple[str, int, int]], made_ns: int) -> None:
        self._many(
            "INSERT INTO changes (made_ns, path, inode, ctime_ns) VALUES (%s, %s, %s, %s)",
            [(made_ns, path, inode, ctime) for path, inode, ctime in changes],
        )

    def forget_changes(self, older_than_ns: int, limit: int) -> int:
        return self._forget_oldest("changes", "seq", older_than_ns, limit)

    def changes_after(self, after: int, missing: Sequence[int], limit: int) -> list[PathChange]:
        rows = self._rows(
            "SELECT seq, path, inode, ctime_ns FROM changes WHERE seq > %s OR seq = ANY(%s) "
            "ORDER BY seq LIMIT %s",
            (after, list(missing), min(limit, PAGE_ROWS_MAX)),
        )
        return [PathChange(*row) for row in rows]

    def change_bounds(self) -> tuple[int, int]:
        row = self._one("SELECT MIN(seq), MAX(seq) FROM changes")
        return (int(row[0] or 0), int(row[1] or 0)) if row else (0, 0)

    # -- nodes --------------------------------------------------------------

    def upsert_node(self, node: NodeState) -> None:
        self._execute(
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
        # Every process sharing an engine on one host runs by its clock.
        return time.time()

    def lease(self) -> Lease:
        row = self._one("SELECT holder, fence, expires FROM lease WHERE id = 1")
        if row is None:
            raise IntegrityError("metadata damaged: the leader's lease row is missing")
        return Lease(*row)

    def set_lease(self, lease: Lease) -> None:
        self._execute(
            "UPDATE lease SET holder = %s, fence = %s, expires = %s WHERE id = 1",
            (lease.holder, lease.fence, lease.expires),
        )

    def upsert_service(self, service: ServiceState) -> None:
        s = service
        self._execute(
            "INSERT INTO services (id, address, engine, started, last_seen) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET "
            "address = excluded.address, last_seen = excluded.last_seen",
            (s.id, s.address, s.engine, s.started, s.last_seen),
        )

    def services(self) -> list[ServiceState]:
        rows = self._rows(
            "SELECT id, address, engine, started, last_seen FROM services ORDER BY id"
        )
        return [ServiceState(*row) for row in rows]

    def forget_services(self, ids: Iterable[str] = (), seen_before: float = 0.0) -> None:
        self._execute(
            "DELETE FROM services WHERE id = ANY(%s) OR last_seen < %s", (list(ids), seen_before)
        )

    def add_bad(self, chunk: str, node: str, reason: str) -> None:
        self._execute(
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
        self._execute("DELETE FROM bad_copies WHERE chunk = %s AND node = %s", (chunk, node))
