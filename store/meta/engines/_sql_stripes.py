"""Storage classes and erasure-coded chunks, as SQL written once for every engine.

``SqlStripes`` is ``Stripes`` (``meta/_repo_tree.py``) over a transaction's
``Statements``: the ``classes`` table (the class set on a directory or file) and the
``pieces`` table (each erasure-coded chunk's K + M pieces, with the node holding each).
A chunk is either replicated (rows in ``replicas``) or striped (rows in
``pieces``), never both once a conversion has committed: ``stripe`` swaps one
for the other in the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..._types import ChunkRef, Stripe
from .._repo import IN_TIER, ChunkRecord, Chunks, Conflict
from ._rows import PAGE_ROWS_MAX, chunk_ref
from ._statements import Statements

PIECE_ROW = "chunk, idx, k, m, piece, length, crc32c, node"


class SqlStripes:
    """Classes and pieces (see ``Stripes`` in ``meta/_repo_tree.py``); the chunk layer
    given (``Chunks``) names the nodes holding a chunk not striped yet."""

    def __init__(self, sql: Statements, chunks: Chunks) -> None:
        self.sql = sql
        self.chunks = chunks

    # -- classes -----------------------------------------------------------------

    def set_class(self, inode: int, name: str) -> None:
        self.sql.execute("DELETE FROM classes WHERE inode = %s", (inode,))
        if name:
            self.sql.execute("INSERT INTO classes (inode, class) VALUES (%s, %s)", (inode, name))

    def classes(self, inodes: Iterable[int]) -> dict[int, str]:
        rows = self.sql.rows(
            "SELECT inode, class FROM classes WHERE inode = ANY(%s)", (list(inodes),)
        )
        return {int(inode): str(name) for inode, name in rows}

    def classed(self) -> list[tuple[int, str]]:
        return [(i, c) for i, c in self.sql.rows("SELECT inode, class FROM classes ORDER BY inode")]

    # -- pieces ------------------------------------------------------------------

    def stripes(self, ids: Iterable[str]) -> dict[str, Stripe]:
        rows = self.sql.rows(
            f"SELECT {PIECE_ROW} FROM pieces WHERE chunk = ANY(%s) ORDER BY chunk, idx",
            (list(ids),),
        )
        return _stripes(rows)

    def unstriped(self, inodes: Iterable[int], limit: int) -> list[ChunkRecord]:
        rows = self.sql.rows(
            "SELECT c.id, c.length, c.crc32c, c.sum FROM chunks c WHERE c.id IN "
            "(SELECT x.chunk FROM extents x WHERE x.inode = ANY(%s)) "
            "AND EXISTS (SELECT 1 FROM replicas r WHERE r.chunk = c.id) "
            "AND NOT EXISTS (SELECT 1 FROM pieces p WHERE p.chunk = c.id) "
            "ORDER BY c.id LIMIT %s",
            (list(inodes), min(limit, PAGE_ROWS_MAX)),
        )
        refs = [ref for ref in (chunk_ref(*row) for row in rows) if ref is not None]
        held = self.chunks.replicas(ref.id for ref in refs)
        return [(ref, held.get(ref.id, ())) for ref in refs]

    def stripe(self, chunk: str, stripe: Stripe) -> tuple[str, ...]:
        # The chunk row locked first: a collection deleting it meanwhile waits, or has
        # won (Conflict: the caller finds it gone when it runs again).
        if not self.sql.rows("UPDATE chunks SET refs = refs WHERE id = %s RETURNING id", (chunk,)):
            raise Conflict(f"chunk {chunk} is gone")
        if self.sql.rows("SELECT 1 FROM pieces WHERE chunk = %s", (chunk,)):
            return ()
        old = self.sql.rows("DELETE FROM replicas WHERE chunk = %s RETURNING node", (chunk,))
        self.sql.many(
            f"INSERT INTO pieces ({PIECE_ROW}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            [
                (chunk, i, stripe.k, stripe.m, p.id, p.length, p.crc32c, node)
                for i, (p, node) in enumerate(zip(stripe.pieces, stripe.nodes, strict=True))
            ],
        )
        return tuple(sorted(node for (node,) in old))

    def short_stripes(self, alive: Iterable[str], limit: int) -> list[tuple[ChunkRef, Stripe]]:
        rows = self.sql.rows(
            "SELECT c.id, c.length, c.crc32c, c.sum FROM chunks c WHERE c.refs > 0 AND c.id IN "
            "(SELECT p.chunk FROM pieces p WHERE NOT p.node = ANY(%s) AND p.node <> %s) "
            "ORDER BY c.id LIMIT %s",
            (sorted(set(alive)), IN_TIER, min(limit, PAGE_ROWS_MAX)),
        )
        refs = [ref for ref in (chunk_ref(*row) for row in rows) if ref is not None]
        found = self.stripes(ref.id for ref in refs)
        return [(ref, found[ref.id]) for ref in refs if ref.id in found]

    def striped(self, pieces: Iterable[str]) -> dict[str, str]:
        rows = self.sql.rows(
            "SELECT piece, chunk FROM pieces WHERE piece = ANY(%s)", (list(pieces),)
        )
        return {str(piece): str(chunk) for piece, chunk in rows}

    def place_piece(self, chunk: str, index: int, was: str, node: str) -> None:
        self.sql.execute(
            "UPDATE pieces SET node = %s WHERE chunk = %s AND idx = %s AND node IN (%s, '')",
            (node, chunk, index, was),
        )


def _stripes(rows: Iterable[tuple[Any, ...]]) -> dict[str, Stripe]:
    """``PIECE_ROW`` rows, by chunk and index, as each chunk's stripe."""
    pieces: dict[str, list[tuple[Any, ...]]] = {}
    for row in rows:
        pieces.setdefault(row[0], []).append(row)
    return {
        chunk: Stripe(
            got[0][2],
            got[0][3],
            tuple(ChunkRef(r[4], r[5], r[6]) for r in got),
            tuple(r[7] for r in got),
        )
        for chunk, got in pieces.items()
    }
