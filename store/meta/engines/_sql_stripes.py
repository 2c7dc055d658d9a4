"""Storage classes and erasure-coded chunks, as SQL written once for every engine.

``SqlStripes`` is the part of ``SqlTx`` (``_sql_tx.py``) that keeps the
``classes`` table (the class set on a directory or file) and the ``pieces``
table (each erasure-coded chunk's K + M pieces, with the node holding each).
A chunk is either replicated (rows in ``replicas``) or striped (rows in
``pieces``), never both once a conversion has committed: ``stripe`` swaps one
for the other in the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..._types import ChunkRef, Stripe
from .._repo import IN_TIER, ChunkRecord, Conflict
from ._rows import PAGE_ROWS_MAX, chunk_ref

PIECE_ROW = "chunk, idx, k, m, piece, length, crc32c, node"


class SqlStripes:
    """Classes and pieces (see ``Tx`` in ``meta/_repo.py``)."""

    def _rows(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def _execute(self, query: str, params: Any = None) -> Any:
        raise NotImplementedError

    def _many(self, query: str, rows: Sequence[Any]) -> int:
        raise NotImplementedError

    def replicas(self, ids: Iterable[str]) -> dict[str, tuple[str, ...]]:
        raise NotImplementedError  # SqlTx's

    # -- classes -----------------------------------------------------------------

    def set_class(self, inode: int, name: str) -> None:
        self._execute("DELETE FROM classes WHERE inode = %s", (inode,))
        if name:
            self._execute("INSERT INTO classes (inode, class) VALUES (%s, %s)", (inode, name))

    def classes(self, inodes: Iterable[int]) -> dict[int, str]:
        rows = self._rows("SELECT inode, class FROM classes WHERE inode = ANY(%s)", (list(inodes),))
        return {int(inode): str(name) for inode, name in rows}

    def classed(self) -> list[tuple[int, str]]:
        return [(i, c) for i, c in self._rows("SELECT inode, class FROM classes ORDER BY inode")]

    # -- pieces ------------------------------------------------------------------

    def stripes(self, ids: Iterable[str]) -> dict[str, Stripe]:
        rows = self._rows(
            f"SELECT {PIECE_ROW} FROM pieces WHERE chunk = ANY(%s) ORDER BY chunk, idx",
            (list(ids),),
        )
        return _stripes(rows)

    def unstriped(self, inodes: Iterable[int], limit: int) -> list[ChunkRecord]:
        rows = self._rows(
            "SELECT c.id, c.length, c.crc32c, c.sum FROM chunks c WHERE c.id IN "
            "(SELECT x.chunk FROM extents x WHERE x.inode = ANY(%s)) "
            "AND EXISTS (SELECT 1 FROM replicas r WHERE r.chunk = c.id) "
            "AND NOT EXISTS (SELECT 1 FROM pieces p WHERE p.chunk = c.id) "
            "ORDER BY c.id LIMIT %s",
            (list(inodes), min(limit, PAGE_ROWS_MAX)),
        )
        refs = [ref for ref in (chunk_ref(*row) for row in rows) if ref is not None]
        held = self.replicas(ref.id for ref in refs)
        return [(ref, held.get(ref.id, ())) for ref in refs]

    def stripe(self, chunk: str, stripe: Stripe) -> tuple[str, ...]:
        # The chunk row locked first: a collection deleting it meanwhile waits, or has
        # won (Conflict: the caller finds it gone when it runs again).
        if not self._rows("UPDATE chunks SET refs = refs WHERE id = %s RETURNING id", (chunk,)):
            raise Conflict(f"chunk {chunk} is gone")
        if self._rows("SELECT 1 FROM pieces WHERE chunk = %s", (chunk,)):
            return ()
        old = self._rows("DELETE FROM replicas WHERE chunk = %s RETURNING node", (chunk,))
        self._many(
            f"INSERT INTO pieces ({PIECE_ROW}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            [
                (chunk, i, stripe.k, stripe.m, p.id, p.length, p.crc32c, node)
                for i, (p, node) in enumerate(zip(stripe.pieces, stripe.nodes, strict=True))
            ],
        )
        return tuple(sorted(node for (node,) in old))

    def short_stripes(self, alive: Iterable[str], limit: int) -> list[tuple[ChunkRef, Stripe]]:
        rows = self._rows(
            "SELECT c.id, c.length, c.crc32c, c.sum FROM chunks c WHERE c.refs > 0 AND c.id IN "
            "(SELECT p.chunk FROM pieces p WHERE NOT p.node = ANY(%s) AND p.node <> %s) "
            "ORDER BY c.id LIMIT %s",
            (sorted(set(alive)), IN_TIER, min(limit, PAGE_ROWS_MAX)),
        )
        refs = [ref for ref in (chunk_ref(*row) for row in rows) if ref is not None]
        found = self.stripes(ref.id for ref in refs)
        return [(ref, found[ref.id]) for ref in refs if ref.id in found]

    def striped(self, pieces: Iterable[str]) -> dict[str, str]:
        rows = self._rows("SELECT piece, chunk FROM pieces WHERE piece = ANY(%s)", (list(pieces),))
        return {str(piece): str(chunk) for piece, chunk in rows}

    def place_piece(self, chunk: str, index: int, was: str, node: str) -> None:
        self._execute(
            "UPDATE pieces SET node = %s WHERE chunk = %s AND idx = %s AND node IN (%s, '')",
            (node, chunk, index, was),
        )

    def forget_pieces(self, chunks: Sequence[str]) -> list[ChunkRecord]:
        """Delete the pieces of these (collected) chunks; those pieces no other stripe
        uses, with the node holding each (its file may go)."""
        rows = self._rows(
            "DELETE FROM pieces WHERE chunk = ANY(%s) RETURNING piece, length, crc32c, node",
            (list(chunks),),
        )
        still = self._rows(
            "SELECT piece FROM pieces WHERE piece = ANY(%s)", ([r[0] for r in rows],)
        )
        shared = {piece for (piece,) in still}
        # A chunk in the S3 tier is its own one piece: its object stays (see docs).
        return [
            (ChunkRef(piece, length, crc), (node,) if node else ())
            for piece, length, crc, node in sorted(rows)
            if piece not in shared and node != IN_TIER
        ]


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
