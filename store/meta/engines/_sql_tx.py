"""The repository's primitives as SQL, written once for every engine.

``SqlTx`` holds each query once, in psycopg's parameter style (``%s``,
``%(name)s``) and in SQL both engines speak. An engine subclasses it with
its connection and overrides only what its dialect really does differently:
SQLite rewrites the parameter style and the array forms (``_sqlite_tx.py``);
PostgreSQL sends many rows as arrays in one statement where SQLite runs a
statement per row in process (``_postgres_tx.py``). Rows are checked as
they become values (``_rows.py``): damage is an ``IntegrityError`` naming
the inode and path, never a wrong answer.

Two forms the subclass translates: ``= ANY(%s)`` takes a list (SQLite: a
JSON array through ``json_each``), and ``GREATEST(a, b)`` (SQLite: ``max``).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from ..._errors import IntegrityError
from ..._paths import MAX_PATH_BYTES
from ..._types import ChunkProblem, Extent, StoredChunk
from .._repo import (
    NEW_INODE_COLUMNS,
    ROOT_INODE,
    ChunkRecord,
    Conflict,
    Degraded,
    Inode,
    NewFile,
    new_values,
)
from ._rows import (
    INODE_ROW,
    PAGE_ROWS_MAX,
    CheckedRows,
    check_entry,
    chunk_ref,
    inode_of,
    named_entry,
)
from ._sql_records import SqlRecords
from ._sql_stripes import SqlStripes
from ._sql_tenants import SqlTenants

MAX_DEPTH = MAX_PATH_BYTES // 2
"""Directories ``path_of`` climbs at most (a path of one-letter names is that deep)."""
LOCK_TRIES = 64
"""Times ``locked_entry`` reads a name again that other writers keep changing."""
JOINED_INODE = ", ".join("i." + c for c in INODE_ROW.split(", "))
NAMED = "entries e LEFT JOIN inodes i ON i.id = e.inode"
"""Entries with their inodes, an entry whose inode is missing too (``named_entry``)."""
EXTENT_ROWS = (
    'SELECT x."offset", x.length, x.chunk, c.length, c.crc32c, x.chunk_offset, x.sum, c.sum '
    "FROM extents x LEFT JOIN chunks c ON c.id = x.chunk "
)


class SqlTx(SqlRecords, SqlStripes, SqlTenants, CheckedRows):
    """A transaction on one connection (see ``Tx`` in ``meta/_repo.py``).

    A subclass gives ``_execute`` (one statement) and ``_many`` (one
    statement for each of many parameter rows) for its connection.
    """

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        self._execute("SAVEPOINT unit")
        try:
            yield
        except BaseException:
            if self._in_transaction():  # a lost connection or a full disk rolled back all
                self._execute("ROLLBACK TO SAVEPOINT unit")
                self._execute("RELEASE SAVEPOINT unit")
            raise
        self._execute("RELEASE SAVEPOINT unit")

    def _in_transaction(self) -> bool:
        """Whether the transaction is still open (a savepoint is there to return to)."""
        raise NotImplementedError

    # -- names and files -------------------------------------------------------

    def lookup(self, parent: int, name: str) -> Inode | None:
        row = self._one(
            f"SELECT e.sum, e.inode, {JOINED_INODE} FROM {NAMED} "
            "WHERE e.parent = %s AND e.name = %s",
            (parent, name),
        )
        return None if row is None else named_entry(parent, name, row, self.path_of)

    def walk(self, parts: Sequence[str]) -> list[Inode]:
        found: list[Inode] = []
        parent = ROOT_INODE
        for name in parts:
            node = self.lookup(parent, name)
            if node is None:
                break
            found.append(node)
            if node.kind != "directory":
                break
            parent = node.id
        return found

    def get(self, inode: int) -> Inode | None:
        row = self._one(f"SELECT {INODE_ROW} FROM inodes WHERE id = %s", (inode,))
        return inode_of(row, self.path_of)

    def locked(self, inode: int) -> Inode | None:
        return inode_of(
            self._one(f"SELECT {INODE_ROW} FROM inodes WHERE id = %s FOR UPDATE", (inode,)),
            self.path_of,
        )

    def locked_entry(self, parent: int, name: str) -> Inode | None:
        entry = (parent, name)
        for _ in range(LOCK_TRIES):
            row = self._one(
                f"SELECT {INODE_ROW} FROM inodes WHERE id = "
                "(SELECT inode FROM entries WHERE parent = %s AND name = %s) FOR UPDATE",
                entry,
            )
            # Read again once locked: it may have moved, or gone and been replaced, meanwhile.
            named = self._one(
                "SELECT inode, sum FROM entries WHERE parent = %s AND name = %s", entry
            )
            if named is None:
                return None
            check_entry(parent, name, named[0], named[1], self.path_of)
            node = inode_of(row, self.path_of)
            if node is not None and node.id == named[0]:
                return node
        raise Conflict(f"the entry {name!r} of directory {parent} kept changing")

    def locked_entries(self, names: Sequence[tuple[int, str]]) -> dict[tuple[int, str], Inode]:
        found = {}
        for parent, name in names:
            node = self.locked_entry(parent, name)
            if node is not None:
                found[parent, name] = node
        return found

    def lock_tree(self) -> None:
        pass  # an engine with one writer at a time holds it already

    def children(self, parent: int) -> list[tuple[str, Inode]]:
        rows = self._rows(
            f"SELECT e.name, e.sum, e.inode, {JOINED_INODE} FROM {NAMED} "
            "WHERE e.parent = %s ORDER BY e.name",
            (parent,),
        )
        return [(row[0], named_entry(parent, row[0], row[1:], self.path_of)) for row in rows]

    def children_page(self, parent: int, after: str, limit: int) -> list[tuple[str, Inode]]:
        rows = self._rows(
            f"SELECT e.name, e.sum, e.inode, {JOINED_INODE} FROM {NAMED} "
            "WHERE e.parent = %s AND e.name > %s ORDER BY e.name LIMIT %s",
            (parent, after, min(limit, PAGE_ROWS_MAX)),
        )
        return [(row[0], named_entry(parent, row[0], row[1:], self.path_of)) for row in rows]

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
        node = self.create(file.attributes)
        self.set_extents(node.id, file.extents)
        self.link(parent, name, node.id)
        return node

    def create_files(self, files: Sequence[tuple[int, str, NewFile]]) -> list[Inode]:
        if len(files) < 2:
            return [self.create_file(parent, name, file) for parent, name, file in files]
        numbered = list(zip(self._new_ids(len(files)), files, strict=True))
        self._many(
            f"INSERT INTO inodes (id, {NEW_INODE_COLUMNS}) VALUES ({', '.join(['%s'] * 13)})",
            [(number, *new_values(file.attributes)) for number, (_, _, file) in numbered],
        )
        self._many(
            "INSERT INTO entries (parent, name, inode) VALUES (%s, %s, %s)",
            [(parent, name, number) for number, (parent, name, _) in numbered],
        )
        extents = [(n, x) for n, (_, _, file) in numbered for x in file.extents]
        self._many(
            'INSERT INTO extents (inode, "offset", length, chunk, chunk_offset) '
            "VALUES (%s, %s, %s, %s, %s)",
            [(n, x.offset, x.length, x.chunk.id, x.chunk_offset) for n, x in extents],
        )
        self._take_references(Counter(x.chunk.id for _, x in extents))
        return [file.inode(number) for number, (_, _, file) in numbered]

    def _new_ids(self, count: int) -> list[int]:
        """Numbers for ``count`` new inodes (SQLite's next rowids: it has one writer)."""
        row = self._one("SELECT MAX(id) FROM inodes")
        first = (row[0] if row and row[0] is not None else 0) + 1
        return list(range(first, first + count))

    def update(self, node: Inode) -> None:
        n = node
        cur = self._execute(
            "UPDATE inodes SET mode = %s, mtime_ns = %s, atime_ns = %s, ctime_ns = %s, "
            "uid = %s, gid = %s WHERE id = %s",
            (n.mode, n.mtime_ns, n.atime_ns, n.ctime_ns, n.uid, n.gid, n.id),
        )
        if cur.rowcount == 0:
            raise Conflict(f"inode {n.id} went while its attributes changed")

    def touch(self, inode: int, now_ns: int, *, links: int = 0, modified: bool = True) -> int:
        row = self._one(
            "UPDATE inodes SET ctime_ns = GREATEST(ctime_ns, %(now)s), "
            "nlink = nlink + %(links)s, "
            "mtime_ns = CASE WHEN %(modified)s THEN %(now)s ELSE mtime_ns END "
            "WHERE id = %(inode)s RETURNING nlink",
            {"now": now_ns, "links": links, "modified": modified, "inode": inode},
        )
        if row is None:
            raise Conflict(f"inode {inode} went while a name of it changed")
        return int(row[0])

    def relink(self, old: int, new: int) -> None:
        self._execute("UPDATE entries SET inode = %s WHERE inode = %s", (new, old))

    def link(self, parent: int, name: str, inode: int) -> None:
        self._execute(
            "INSERT INTO entries (parent, name, inode) VALUES (%s, %s, %s)", (parent, name, inode)
        )

    def unlink(self, parent: int, name: str) -> None:
        cur = self._execute("DELETE FROM entries WHERE parent = %s AND name = %s", (parent, name))
        if cur.rowcount == 0:
            raise Conflict(f"the entry {name!r} of directory {parent} went before it was removed")

    def delete(self, inode: int) -> None:
        gone = self._rows("DELETE FROM extents WHERE inode = %s RETURNING chunk", (inode,))
        self._release(Counter(chunk for (chunk,) in gone))
        self._execute("DELETE FROM inodes WHERE id = %s", (inode,))

    def _release(self, uses: Counter[str]) -> None:
        now = time.time_ns()
        self._many(
            "UPDATE chunks SET refs = refs - %(n)s, zero_since_ns = "
            "CASE WHEN refs - %(n)s = 0 THEN %(now)s ELSE zero_since_ns END WHERE id = %(id)s",
            [{"n": n, "now": now, "id": chunk} for chunk, n in uses.items()],
        )

    def extents(self, inode: int) -> list[Extent]:
        rows = self._rows(EXTENT_ROWS + 'WHERE x.inode = %s ORDER BY x."offset"', (inode,))
        size = self._one("SELECT size FROM inodes WHERE id = %s", (inode,))
        return self._tiled(inode, [self._extent(inode, *row) for row in rows], size)

    def extents_page(self, inode: int, start: int, limit: int) -> list[Extent]:
        # The extent covering ``start`` begins at the greatest offset <= start;
        # that the pages tile the file is checked by whoever gathers them.
        rows = self._rows(
            EXTENT_ROWS + 'WHERE x.inode = %(inode)s AND x."offset" >= COALESCE('
            '(SELECT MAX("offset") FROM extents WHERE inode = %(inode)s '
            'AND "offset" <= %(start)s), 0) ORDER BY x."offset" LIMIT %(limit)s',
            {"inode": inode, "start": start, "limit": min(limit, PAGE_ROWS_MAX)},
        )
        return [self._extent(inode, *row) for row in rows]

    def set_extents(self, inode: int, extents: Iterable[Extent]) -> None:
        extents = list(extents)
        self._many(
            'INSERT INTO extents (inode, "offset", length, chunk, chunk_offset) '
            "VALUES (%s, %s, %s, %s, %s)",
            [(inode, x.offset, x.length, x.chunk.id, x.chunk_offset) for x in extents],
        )
        self._take_references(Counter(x.chunk.id for x in extents))

    def _take_references(self, uses: Counter[str]) -> None:
        """A reference on each chunk for each use; every chunk row still there."""
        counted = self._many(
            "UPDATE chunks SET refs = refs + %s WHERE id = %s",
            [(n, chunk) for chunk, n in uses.items()],
        )
        self._check_counted(counted, len(uses))

    @staticmethod
    def _check_counted(counted: int, chunks: int) -> None:
        """A reference taken on a chunk row another writer collected meanwhile: go again
        (the next run finds the chunk missing and says so)."""
        if counted != chunks:
            raise Conflict(f"{chunks - counted} chunk row(s) went while a file was committed")

    # -- chunks -------------------------------------------------------------

    def add_chunks(self, chunks: Iterable[StoredChunk]) -> None:
        chunks = list(chunks)
        now = time.time_ns()
        self._many(
            "INSERT INTO chunks (id, length, crc32c, refs, zero_since_ns) "
            "VALUES (%s, %s, %s, 0, %s) ON CONFLICT DO NOTHING",
            [(s.chunk.id, s.chunk.length, s.chunk.crc32c, now) for s in chunks],
        )
        self._many(
            "INSERT INTO replicas (chunk, node) VALUES (%s, %s) ON CONFLICT DO NOTHING",
            [(s.chunk.id, node) for s in chunks for node in s.nodes],
        )
        self._many(
            "INSERT INTO chunk_bytes (id, data) VALUES (%s, %s) ON CONFLICT DO NOTHING",
            [(s.chunk.id, s.data) for s in chunks if s.data is not None],
        )

    def inline(self, ids: Iterable[str]) -> dict[str, bytes]:
        wanted = list(ids)
        if not wanted:
            return {}
        rows = self._rows("SELECT id, data FROM chunk_bytes WHERE id = ANY(%s)", (wanted,))
        return {chunk: bytes(data) for chunk, data in rows}

    def replicas(self, ids: Iterable[str]) -> dict[str, tuple[str, ...]]:
        rows = self._rows(
            "SELECT chunk, node FROM replicas WHERE chunk = ANY(%s) ORDER BY chunk, node",
            (list(ids),),
        )
        return grouped(rows)

    def referenced(self, ids: Iterable[str]) -> dict[str, tuple[str, ...]]:
        # A chunk the engine keeps, or one kept erasure-coded, is held too (no nodes): a
        # new file reuses it, so no chunk is kept in two ways at once.
        wanted = list(ids)
        rows = self._rows(
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
        return {c for (c,) in self._rows("SELECT id FROM chunks WHERE id = ANY(%s)", (list(ids),))}

    def named(self, ids: Iterable[str]) -> set[str]:
        rows = self._rows(
            "SELECT id FROM chunks WHERE id = ANY(%(ids)s) "
            "UNION SELECT chunk FROM extents WHERE chunk = ANY(%(ids)s) "
            "UNION SELECT chunk FROM replicas WHERE chunk = ANY(%(ids)s) "
            "UNION SELECT piece FROM pieces WHERE piece = ANY(%(ids)s)",
            {"ids": list(ids)},
        )
        return {c for (c,) in rows}

    def chunk_page(self, after: str, limit: int) -> tuple[list[ChunkRecord], str]:
        limit = min(limit, PAGE_ROWS_MAX)
        rows = self._rows(
            "SELECT id, length, crc32c, sum FROM chunks WHERE id > %s ORDER BY id LIMIT %s",
            (after, limit),
        )
        refs = [ref for ref in (chunk_ref(*row) for row in rows) if ref is not None]
        held = self.replicas(ref.id for ref in refs)
        last = rows[-1][0] if len(rows) == limit else ""
        return [(ref, held.get(ref.id, ())) for ref in refs], last if isinstance(last, str) else ""

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
            "SELECT id, length, crc32c, sum FROM chunks c WHERE refs = 0 AND zero_since_ns < %s "
            "AND NOT EXISTS (SELECT 1 FROM extents x WHERE x.chunk = c.id) ORDER BY id LIMIT %s",
            (older_than_ns, min(limit, PAGE_ROWS_MAX)),
        )
        found = {ref.id: ref for ref in (chunk_ref(*row) for row in rows) if ref is not None}
        # ``refs = 0`` again: a commit may have taken a reference since the look above.
        gone = self._rows(
            "DELETE FROM chunks WHERE id = ANY(%s) AND refs = 0 RETURNING id", (list(found),)
        )
        ids = sorted(chunk for (chunk,) in gone)
        self._execute("DELETE FROM chunk_bytes WHERE id = ANY(%s)", (ids,))
        held = grouped(
            sorted(self._rows("DELETE FROM replicas WHERE chunk = ANY(%s) RETURNING *", (ids,)))
        )
        return [(found[chunk], held.get(chunk, ())) for chunk in ids] + self.forget_pieces(ids)

    def inconsistencies(self, limit: int) -> list[ChunkProblem]:
        raise NotImplementedError

    def store_id(self) -> str:
        row = self._one("SELECT id FROM store")
        if row is None or not isinstance(row[0], str):
            raise IntegrityError("metadata damaged: the store's id is missing")
        return row[0]

    def sealed(self) -> str:
        row = self._one("SELECT sealed FROM store")
        if row is None or not isinstance(row[0], str):
            raise IntegrityError("metadata damaged: the store's record of encryption is missing")
        return row[0]

    def seal(self, check: str) -> str:
        self._execute("UPDATE store SET sealed = %s WHERE sealed = ''", (check,))
        return self.sealed()

    def add_replicas(self, chunk: str, nodes: Iterable[str]) -> None:
        self._many(
            "INSERT INTO replicas (chunk, node) VALUES (%s, %s) ON CONFLICT DO NOTHING",
            [(chunk, node) for node in nodes],
        )

    def drop_replica(self, chunk: str, node: str) -> None:
        self._execute("DELETE FROM replicas WHERE chunk = %s AND node = %s", (chunk, node))
        self._execute("UPDATE pieces SET node = '' WHERE piece = %s AND node = %s", (chunk, node))

    def degraded(self, alive: Iterable[str], limit: int) -> list[Degraded]:
        # One pass over referenced chunks; an index of "replicas per chunk"
        # would be the next step for large stores.
        rows = self._rows(
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


def grouped(rows: Iterable[tuple[Any, ...]]) -> dict[str, tuple[str, ...]]:
    """``(chunk, node)`` rows, in order, as each chunk's nodes."""
    found: dict[str, list[str]] = {}
    for chunk, node in rows:
        held = found.setdefault(chunk, [])
        if node is not None:  # none: the engine keeps it
            held.append(node)
    return {chunk: tuple(nodes) for chunk, nodes in found.items()}
