"""The chunk layer, as SQL written once for every engine.

``SqlChunks`` is ``Chunks`` (``meta/_repo_tree.py``) over a transaction's ``Statements``:
the ``chunks`` rows, the ``replicas`` naming the nodes that hold each copy, the bytes of
small chunks the engine keeps itself (``chunk_bytes``), and the collection of chunks no
file uses (with the pieces of those kept erasure-coded). PostgreSQL records new chunks in
one statement (``PostgresChunks``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from ..._types import ChunkRef, Collection, StoredChunk
from .._repo import IN_TIER, ChunkRecord, Degraded, Forgotten
from ._rows import PAGE_ROWS_MAX, chunk_ref
from ._sql_records import forget_oldest, held_since
from ._statements import Statements


class SqlChunks:
    """Chunks, their copies and their collection (see ``Chunks`` in ``meta/_repo_tree.py``)."""

    def __init__(self, sql: Statements) -> None:
        self.sql = sql

    def add_chunks(self, chunks: Iterable[StoredChunk]) -> None:
        chunks = list(chunks)
        now = time.time_ns()
        self.sql.many(
            "INSERT INTO chunks (id, length, crc32c, refs, zero_since_ns) "
            "VALUES (%s, %s, %s, 0, %s) ON CONFLICT DO NOTHING",
            [(s.chunk.id, s.chunk.length, s.chunk.crc32c, now) for s in chunks],
        )
        self.sql.many(
            "INSERT INTO replicas (chunk, node) VALUES (%s, %s) ON CONFLICT DO NOTHING",
            [(s.chunk.id, node) for s in chunks for node in s.nodes],
        )
        self.sql.many(
            "INSERT INTO chunk_bytes (id, data) VALUES (%s, %s) ON CONFLICT DO NOTHING",
            [(s.chunk.id, s.data) for s in chunks if s.data is not None],
        )

    def inline(self, ids: Iterable[str]) -> dict[str, bytes]:
        wanted = list(ids)
        if not wanted:
            return {}
        rows = self.sql.rows("SELECT id, data FROM chunk_bytes WHERE id = ANY(%s)", (wanted,))
        return {chunk: bytes(data) for chunk, data in rows}

    def replicas(self, ids: Iterable[str]) -> dict[str, tuple[str, ...]]:
        rows = self.sql.rows(
            "SELECT chunk, node FROM replicas WHERE chunk = ANY(%s) ORDER BY chunk, node",
            (list(ids),),
        )
        return grouped(rows)

    def referenced(self, ids: Iterable[str]) -> dict[str, tuple[str, ...]]:
        # A chunk the engine keeps, or one kept erasure-coded, is held too (no nodes): a
        # new file reuses it, so no chunk is kept in two ways at once.
        wanted = list(ids)
        rows = self.sql.rows(
            "SELECT r.chunk, r.node FROM chunks c JOIN replicas r ON r.chunk = c.id "
            "WHERE c.refs > 0 AND c.id = ANY(%(ids)s) "
            "UNION ALL SELECT b.id, NULL FROM chunks c JOIN chunk_bytes b ON b.id = c.id "
            "WHERE c.refs > 0 AND c.id = ANY(%(ids)s) "
            "UNION ALL SELECT p.chunk, NULL FROM chunks c JOIN pieces p ON p.chunk = c.id "
            "WHERE c.refs > 0 AND p.idx = 0 AND c.id = ANY(%(ids)s) ORDER BY 1, 2",
            {"ids": wanted},
        )
        return grouped(rows)

    def known(self, ids: Iterable[str]) -> set[str]:
        return {
            c for (c,) in self.sql.rows("SELECT id FROM chunks WHERE id = ANY(%s)", (list(ids),))
        }

    def named(self, ids: Iterable[str]) -> set[str]:
        rows = self.sql.rows(
            "SELECT id FROM chunks WHERE id = ANY(%(ids)s) "
            "UNION SELECT chunk FROM extents WHERE chunk = ANY(%(ids)s) "
            "UNION SELECT chunk FROM replicas WHERE chunk = ANY(%(ids)s) "
            "UNION SELECT piece FROM pieces WHERE piece = ANY(%(ids)s)",
            {"ids": list(ids)},
        )
        return {c for (c,) in rows}

    def chunk_page(self, after: str, limit: int) -> tuple[list[ChunkRecord], str]:
        limit = min(limit, PAGE_ROWS_MAX)
        rows = self.sql.rows(
            "SELECT id, length, crc32c, sum FROM chunks WHERE id > %s ORDER BY id LIMIT %s",
            (after, limit),
        )
        refs = [ref for ref in (chunk_ref(*row) for row in rows) if ref is not None]
        held = self.replicas(ref.id for ref in refs)
        last = rows[-1][0] if len(rows) == limit else ""
        return [(ref, held.get(ref.id, ())) for ref in refs], last if isinstance(last, str) else ""

    def forget_unreferenced(self, older_than_ns: int, limit: int) -> list[Forgotten]:
        # A chunk unreferenced since a backup was taken may be what that backup's files
        # need: it stays while the backup's hold lasts, whoever collects.
        backup = held_since(self.sql, time.time_ns())
        if backup is not None:
            older_than_ns = min(older_than_ns, backup)
        # An extent naming the chunk means its refs count is wrong, not that it is free.
        rows = self.sql.rows(
            "SELECT id, length, crc32c, sum, zero_since_ns FROM chunks c WHERE refs = 0 "
            "AND zero_since_ns < %s AND NOT EXISTS (SELECT 1 FROM extents x WHERE x.chunk = c.id) "
            "ORDER BY zero_since_ns, id LIMIT %s",
            (older_than_ns, min(limit, PAGE_ROWS_MAX)),
        )
        found = {ref.id: (ref, zero) for *row, zero in rows if (ref := chunk_ref(*row))}
        # ``refs = 0`` again: a commit may have taken a reference since the look above.
        gone = self.sql.rows(
            "DELETE FROM chunks WHERE id = ANY(%s) AND refs = 0 RETURNING id", (list(found),)
        )
        ids = sorted(chunk for (chunk,) in gone)
        self.sql.execute("DELETE FROM chunk_bytes WHERE id = ANY(%s)", (ids,))
        held = grouped(
            sorted(self.sql.rows("DELETE FROM replicas WHERE chunk = ANY(%s) RETURNING *", (ids,)))
        )
        cutoff = {chunk: found[chunk][1] for chunk in ids}
        forgotten = [(found[c][0], held.get(c, ()), cutoff[c]) for c in ids]
        forgotten += [(p, nodes, cutoff[c]) for c, p, nodes in self._forget_pieces(ids)]
        self._record_collected(forgotten, len(ids))
        return forgotten

    def _record_collected(self, forgotten: list[Forgotten], chunks: int) -> None:
        """Each forgotten chunk (and piece) under its cutoff, for ``collected``; the
        store's totals of what was freed."""
        if not forgotten:
            return
        now = time.time_ns()
        self.sql.many(
            "INSERT INTO collected (chunk, cutoff_ns, made_ns) VALUES (%s, %s, %s) "
            "ON CONFLICT (chunk) DO UPDATE SET cutoff_ns = excluded.cutoff_ns, "
            "made_ns = excluded.made_ns",
            [(ref.id, cutoff, now) for ref, _, cutoff in forgotten],
        )
        freed = sum(ref.length * len(nodes) for ref, nodes, _ in forgotten)
        self.sql.execute(
            "UPDATE store SET freed_chunks = freed_chunks + %s, freed_bytes = freed_bytes + %s",
            (chunks, freed),
        )

    def orphaned(self, ids: Iterable[str], cutoff_ns: int) -> list[str]:
        wanted = list(ids)
        named = self.named(wanted) if wanted else set()
        orphans = [c for c in wanted if c not in named]
        now = time.time_ns()
        self.sql.many(
            "INSERT INTO collected (chunk, cutoff_ns, made_ns) VALUES (%s, %s, %s) "
            "ON CONFLICT (chunk) DO UPDATE SET cutoff_ns = excluded.cutoff_ns, "
            "made_ns = excluded.made_ns",
            [(c, cutoff_ns, now) for c in orphans],
        )
        return orphans

    def collected(self, ids: Iterable[str]) -> dict[str, int]:
        wanted = list(ids)
        if not wanted:
            return {}
        rows = self.sql.rows(
            "SELECT chunk, cutoff_ns FROM collected WHERE chunk = ANY(%s)", (wanted,)
        )
        return {chunk: int(cutoff) for chunk, cutoff in rows}

    def expire_collected(self, older_than_ns: int, limit: int) -> int:
        return forget_oldest(self.sql, "collected", "chunk", older_than_ns, limit)

    def collection(self) -> Collection:
        copies = self.sql.one(
            "SELECT COUNT(*), COALESCE(SUM(c.length * "
            "(SELECT COUNT(*) FROM replicas r WHERE r.chunk = c.id)), 0) "
            "FROM chunks c WHERE c.refs = 0"
        )
        pieces = self.sql.one(
            "SELECT COALESCE(SUM(p.length), 0) FROM chunks c JOIN pieces p ON p.chunk = c.id "
            "WHERE c.refs = 0 AND p.node != '' AND p.node != %s",
            (IN_TIER,),
        )
        freed = self.sql.one("SELECT freed_chunks, freed_bytes FROM store")
        waiting, on_nodes = copies or (0, 0)
        return Collection(
            int(waiting),
            int(on_nodes) + int(pieces[0] if pieces else 0),
            *((int(freed[0]), int(freed[1])) if freed else (0, 0)),
        )

    def add_replicas(self, chunk: str, nodes: Iterable[str]) -> None:
        self.sql.many(
            "INSERT INTO replicas (chunk, node) VALUES (%s, %s) ON CONFLICT DO NOTHING",
            [(chunk, node) for node in nodes],
        )

    def drop_replica(self, chunk: str, node: str) -> None:
        self.sql.execute("DELETE FROM replicas WHERE chunk = %s AND node = %s", (chunk, node))
        self.sql.execute(
            "UPDATE pieces SET node = '' WHERE piece = %s AND node = %s", (chunk, node)
        )

    def degraded(self, alive: Iterable[str], limit: int) -> list[Degraded]:
        # One pass over referenced chunks; an index of "replicas per chunk"
        # would be the next step for large stores.
        rows = self.sql.rows(
            "WITH want AS (SELECT x.chunk, MAX(i.replication) AS copies FROM extents x "
            "JOIN inodes i ON i.id = x.inode GROUP BY x.chunk), "
            "have AS (SELECT r.chunk, COUNT(*) AS copies FROM replicas r "
            "WHERE r.node = ANY(%s) GROUP BY r.chunk) "
            "SELECT c.id, c.length, c.crc32c, c.sum, w.copies FROM chunks c "
            "JOIN want w ON w.chunk = c.id LEFT JOIN have h ON h.chunk = c.id "
            "WHERE c.refs > 0 AND COALESCE(h.copies, 0) < w.copies "
            "AND NOT EXISTS (SELECT 1 FROM pieces p WHERE p.chunk = c.id) "
            "AND (NOT EXISTS (SELECT 1 FROM chunk_bytes b WHERE b.id = c.id) "
            "OR EXISTS (SELECT 1 FROM replicas r WHERE r.chunk = c.id)) "
            "ORDER BY c.id LIMIT %s",
            (sorted(set(alive)), limit),
        )
        live = set(alive)
        held = self.replicas(chunk for chunk, *_ in rows)
        # A row that fails its checksum is left to fsck: a copy made from it could be wrong.
        found = [(chunk_ref(*row[:4]), row[4]) for row in rows]
        return [
            Degraded(ref, tuple(n for n in held.get(ref.id, ()) if n in live), want)
            for ref, want in found
            if ref is not None
        ]

    def _forget_pieces(self, chunks: Sequence[str]) -> list[tuple[str, ChunkRef, tuple[str, ...]]]:
        """Delete the pieces of these (collected) chunks; those pieces no other stripe
        uses, each after its chunk's id and with the node holding it (its file may go)."""
        rows = self.sql.rows(
            "DELETE FROM pieces WHERE chunk = ANY(%s) RETURNING piece, length, crc32c, node, chunk",
            (list(chunks),),
        )
        still = self.sql.rows(
            "SELECT piece FROM pieces WHERE piece = ANY(%s)", ([r[0] for r in rows],)
        )
        shared = {piece for (piece,) in still}
        # A chunk in the S3 tier is its own one piece: its object stays (see docs).
        return [
            (chunk, ChunkRef(piece, length, crc), (node,) if node else ())
            for piece, length, crc, node, chunk in sorted(rows)
            if piece not in shared and node != IN_TIER
        ]


def grouped(rows: Iterable[tuple[Any, ...]]) -> dict[str, tuple[str, ...]]:
    """``(chunk, node)`` rows, in order, as each chunk's nodes."""
    found: dict[str, list[str]] = {}
    for chunk, node in rows:
        held = found.setdefault(chunk, [])
        if node is not None:  # none: the engine keeps it
            held.append(node)
    return {chunk: tuple(nodes) for chunk, nodes in found.items()}
