"""The tree's names and inodes, as SQL written once for every engine.

``SqlTree`` is ``Tree`` (``meta/_repo_tree.py``) over a transaction's ``Statements``: the
``entries`` and ``inodes`` tables, and the locks a writer takes on them. Rows are checked as
they become values (``_rows.py``): damage is an ``IntegrityError`` naming the inode and
path, never a wrong answer. An engine whose dialect does a lookup or a lock its own way
subclasses it (``SQLiteTree``, ``PostgresTree``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..._paths import MAX_PATH_BYTES
from .._repo import NEW_INODE_COLUMNS, ROOT_INODE, Conflict, Inode, new_values
from ._rows import INODE_ROW, PAGE_ROWS_MAX, check_entry, inode_of, named_entry
from ._statements import Statements

MAX_DEPTH = MAX_PATH_BYTES // 2
"""Directories ``path_of`` climbs at most (a path of one-letter names is that deep)."""
LOCK_TRIES = 64
"""Times ``locked_entry`` reads a name again that other writers keep changing."""
JOINED_INODE = ", ".join("i." + c for c in INODE_ROW.split(", "))
NAMED = "entries e LEFT JOIN inodes i ON i.id = e.inode"
"""Entries with their inodes, an entry whose inode is missing too (``named_entry``)."""


class SqlTree:
    """Names and the inodes they name (see ``Tree`` in ``meta/_repo_tree.py``)."""

    def __init__(self, sql: Statements) -> None:
        self.sql = sql

    def lookup(self, parent: int, name: str) -> Inode | None:
        row = self.sql.one(
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
        row = self.sql.one(f"SELECT {INODE_ROW} FROM inodes WHERE id = %s", (inode,))
        return inode_of(row, self.path_of)

    def locked(self, inode: int) -> Inode | None:
        return inode_of(
            self.sql.one(f"SELECT {INODE_ROW} FROM inodes WHERE id = %s FOR UPDATE", (inode,)),
            self.path_of,
        )

    def locked_entry(self, parent: int, name: str) -> Inode | None:
        entry = (parent, name)
        for _ in range(LOCK_TRIES):
            row = self.sql.one(
                f"SELECT {INODE_ROW} FROM inodes WHERE id = "
                "(SELECT inode FROM entries WHERE parent = %s AND name = %s) FOR UPDATE",
                entry,
            )
            # Read again once locked: it may have moved, or gone and been replaced, meanwhile.
            named = self.sql.one(
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
        rows = self.sql.rows(
            f"SELECT e.parent, e.name, e.sum, e.inode, {JOINED_INODE} FROM {NAMED} "
            "WHERE e.parent = %s ORDER BY e.name",
            (parent,),
        )
        return self._named(rows)

    def children_page(self, parent: int, after: str, limit: int) -> list[tuple[str, Inode]]:
        rows = self.sql.rows(
            f"SELECT e.parent, e.name, e.sum, e.inode, {JOINED_INODE} FROM {NAMED} "
            "WHERE e.parent = %s AND e.name > %s ORDER BY e.name LIMIT %s",
            (parent, after, min(limit, PAGE_ROWS_MAX)),
        )
        return self._named(rows)

    def _named(self, rows: list[tuple[Any, ...]]) -> list[tuple[str, Inode]]:
        """A directory's rows as names and inodes, each checked against its sum with the
        parent it holds: a damaged page can hand a range scan a row of another parent
        (SQLite trusts the B-tree's order), whose sum then does not match."""
        return [(row[1], named_entry(row[0], row[1], row[2:], self.path_of)) for row in rows]

    def has_children(self, parent: int) -> bool:
        return (
            self.sql.one("SELECT 1 FROM entries WHERE parent = %s LIMIT 1", (parent,)) is not None
        )

    def create(self, node: Inode) -> Inode:
        row = self.sql.one(
            f"INSERT INTO inodes ({NEW_INODE_COLUMNS}) VALUES ({', '.join(['%s'] * 12)}) "
            "RETURNING id",
            new_values(node),
        )
        assert row is not None
        return replace(node, id=row[0])

    def update(self, node: Inode) -> None:
        n = node
        cur = self.sql.execute(
            "UPDATE inodes SET mode = %s, mtime_ns = %s, atime_ns = %s, ctime_ns = %s, "
            "uid = %s, gid = %s WHERE id = %s",
            (n.mode, n.mtime_ns, n.atime_ns, n.ctime_ns, n.uid, n.gid, n.id),
        )
        if cur.rowcount == 0:
            raise Conflict(f"inode {n.id} went while its attributes changed")

    def touch(self, inode: int, now_ns: int, *, links: int = 0, modified: bool = True) -> int:
        row = self.sql.one(
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
        self.sql.execute("UPDATE entries SET inode = %s WHERE inode = %s", (new, old))

    def link(self, parent: int, name: str, inode: int) -> None:
        self.sql.execute(
            "INSERT INTO entries (parent, name, inode) VALUES (%s, %s, %s)", (parent, name, inode)
        )

    def unlink(self, parent: int, name: str) -> None:
        cur = self.sql.execute(
            "DELETE FROM entries WHERE parent = %s AND name = %s", (parent, name)
        )
        if cur.rowcount == 0:
            raise Conflict(f"the entry {name!r} of directory {parent} went before it was removed")

    def path_of(self, inode: int) -> str | None:
        names: list[str] = []
        while inode != ROOT_INODE:
            row = self.sql.one(
                "SELECT parent, name FROM entries WHERE inode = %s LIMIT 1", (inode,)
            )
            if row is None or len(names) >= MAX_DEPTH:  # unlinked, or a damaged loop
                return None
            inode, name = row
            names.append(name)
        return "/" + "/".join(reversed(names))
