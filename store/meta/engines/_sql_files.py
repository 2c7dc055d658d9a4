"""Files' extents and the chunk references they hold, as SQL written once for every engine.

``SqlFiles`` is ``Files`` (``meta/_repo_tree.py``) over a transaction's ``Statements``: the
``extents`` table, and the ``refs`` count each extent adds to its chunk's row. A new file
is made through the tree (``Tree.create``, ``Tree.link``), given to it in its constructor.
PostgreSQL, across a network, does a new or deleted file in one statement
(``PostgresFiles``).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Sequence

from ..._types import Extent
from .._repo import NEW_INODE_COLUMNS, Conflict, Inode, NewFile, Tree, new_values
from ._rows import PAGE_ROWS_MAX, extent_of, tiled
from ._statements import Statements

EXTENT_ROWS = (
    'SELECT x."offset", x.length, x.chunk, c.length, c.crc32c, x.chunk_offset, x.sum, c.sum '
    "FROM extents x LEFT JOIN chunks c ON c.id = x.chunk "
)


class SqlFiles:
    """Extents and chunk references (see ``Files`` in ``meta/_repo_tree.py``)."""

    def __init__(self, sql: Statements, tree: Tree) -> None:
        self.sql = sql
        self.tree = tree

    def create_file(self, parent: int, name: str, file: NewFile) -> Inode:
        node = self.tree.create(file.attributes)
        self.set_extents(node.id, file.extents)
        self.tree.link(parent, name, node.id)
        return node

    def create_files(self, files: Sequence[tuple[int, str, NewFile]]) -> list[Inode]:
        if len(files) < 2:
            return [self.create_file(parent, name, file) for parent, name, file in files]
        numbered = list(zip(self.new_ids(len(files)), files, strict=True))
        self.sql.many(
            f"INSERT INTO inodes (id, {NEW_INODE_COLUMNS}) VALUES ({', '.join(['%s'] * 13)})",
            [(number, *new_values(file.attributes)) for number, (_, _, file) in numbered],
        )
        self.sql.many(
            "INSERT INTO entries (parent, name, inode) VALUES (%s, %s, %s)",
            [(parent, name, number) for number, (parent, name, _) in numbered],
        )
        extents = [(n, x) for n, (_, _, file) in numbered for x in file.extents]
        self.sql.many(
            'INSERT INTO extents (inode, "offset", length, chunk, chunk_offset) '
            "VALUES (%s, %s, %s, %s, %s)",
            [(n, x.offset, x.length, x.chunk.id, x.chunk_offset) for n, x in extents],
        )
        self._take_references(Counter(x.chunk.id for _, x in extents))
        return [file.inode(number) for number, (_, _, file) in numbered]

    def new_ids(self, count: int) -> list[int]:
        """Numbers for ``count`` new inodes (SQLite's next rowids: it has one writer)."""
        row = self.sql.one("SELECT MAX(id) FROM inodes")
        first = (row[0] if row and row[0] is not None else 0) + 1
        return list(range(first, first + count))

    def delete(self, inode: int) -> None:
        gone = self.sql.rows("DELETE FROM extents WHERE inode = %s RETURNING chunk", (inode,))
        self._release(Counter(chunk for (chunk,) in gone))
        self.sql.execute("DELETE FROM inodes WHERE id = %s", (inode,))

    def _release(self, uses: Counter[str]) -> None:
        now = time.time_ns()
        self.sql.many(
            "UPDATE chunks SET refs = refs - %(n)s, zero_since_ns = "
            "CASE WHEN refs - %(n)s = 0 THEN %(now)s ELSE zero_since_ns END WHERE id = %(id)s",
            [{"n": n, "now": now, "id": chunk} for chunk, n in uses.items()],
        )

    def extents(self, inode: int) -> list[Extent]:
        rows = self.sql.rows(EXTENT_ROWS + 'WHERE x.inode = %s ORDER BY x."offset"', (inode,))
        size = self.sql.one("SELECT size FROM inodes WHERE id = %s", (inode,))
        path_of = self.tree.path_of
        return tiled(inode, [extent_of(inode, row, path_of) for row in rows], size, path_of)

    def extents_page(self, inode: int, start: int, limit: int) -> list[Extent]:
        # The extent covering ``start`` begins at the greatest offset <= start;
        # that the pages tile the file is checked by whoever gathers them.
        rows = self.sql.rows(
            EXTENT_ROWS + 'WHERE x.inode = %(inode)s AND x."offset" >= COALESCE('
            '(SELECT MAX("offset") FROM extents WHERE inode = %(inode)s '
            'AND "offset" <= %(start)s), 0) ORDER BY x."offset" LIMIT %(limit)s',
            {"inode": inode, "start": start, "limit": min(limit, PAGE_ROWS_MAX)},
        )
        return [extent_of(inode, row, self.tree.path_of) for row in rows]

    def set_extents(self, inode: int, extents: Iterable[Extent]) -> None:
        extents = list(extents)
        self.sql.many(
            'INSERT INTO extents (inode, "offset", length, chunk, chunk_offset) '
            "VALUES (%s, %s, %s, %s, %s)",
            [(inode, x.offset, x.length, x.chunk.id, x.chunk_offset) for x in extents],
        )
        self._take_references(Counter(x.chunk.id for x in extents))

    def _take_references(self, uses: Counter[str]) -> None:
        """A reference on each chunk for each use; every chunk row still there."""
        counted = self.sql.many(
            "UPDATE chunks SET refs = refs + %s WHERE id = %s",
            [(n, chunk) for chunk, n in uses.items()],
        )
        check_counted(counted, len(uses))

    def chunk_users(self, chunk: str, after: int, limit: int) -> list[int]:
        rows = self.sql.rows(
            "SELECT DISTINCT inode FROM extents WHERE chunk = %s AND inode > %s "
            "ORDER BY inode LIMIT %s",
            (chunk, after, min(limit, PAGE_ROWS_MAX)),
        )
        return [inode for (inode,) in rows]


def check_counted(counted: int, chunks: int) -> None:
    """A reference taken on a chunk row another writer collected meanwhile: go again
    (the next run finds the chunk missing and says so)."""
    if counted != chunks:
        raise Conflict(f"{chunks - counted} chunk row(s) went while a file was committed")
