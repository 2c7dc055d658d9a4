"""fsck of the SQLite engine itself: where its tables contradict each other.

A flipped bit in ``meta.db`` usually leaves the b-trees well formed, so
SQLite's own checks pass, while a value changes: an entry names an inode
that is not there (``ls`` silently shows one file fewer), an extent names a
chunk without a row, a chunk's reference count stops matching the extents
that use it (and collection would delete a live chunk). Each query below
looks for one such contradiction. They read the tables themselves, not the
indexes, which may still hold the value from before the flip (``NOT
INDEXED`` is not enough: a WITHOUT ROWID table is still scanned through a
covering index, so its primary key is named); ``PRAGMA integrity_check``
then reports those indexes too.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator

from ..._types import ChunkProblem

PathOf = Callable[[int], str | None]


def _table(name: str, alias: str = "") -> str:
    """A WITHOUT ROWID table read through its primary key, never another index of its."""
    return f"{name}{f' AS {alias}' if alias else ''} INDEXED BY sqlite_autoindex_{name}_1"


EXTENTS, ENTRIES = _table("extents"), _table("entries")

_HEX_ID = "typeof({0}) = 'text' AND length({0}) = 64 AND {0} NOT GLOB '*[^0-9a-f]*'"
BAD_ROWS = {
    "inodes": (
        "SELECT id, 'inode ' || quote(id) || ' does not decode' FROM inodes "
        "WHERE typeof(id) != 'integer' OR kind NOT IN ('file', 'directory') "
        "OR typeof(size) != 'integer' OR size < 0 OR typeof(mode) != 'integer' "
        "OR typeof(mtime_ns) != 'integer' OR typeof(generation) != 'integer' "
        "OR typeof(replication) != 'integer' OR replication < 1"
    ),
    "entries": (
        "SELECT NULL, 'the entry ' || quote(name) || ' in directory ' || quote(parent) || "
        f"' does not decode' FROM {ENTRIES} WHERE typeof(parent) != 'integer' "
        "OR typeof(name) != 'text' OR name = '' OR instr(name, '/') > 0 "
        "OR typeof(inode) != 'integer'"
    ),
    "chunks": (
        "SELECT NULL, 'the chunk row ' || quote(id) || ' does not decode' FROM chunks "
        f"WHERE NOT ({_HEX_ID.format('id')}) OR typeof(length) != 'integer' OR length < 0 "
        "OR typeof(crc32c) != 'integer' OR typeof(refs) != 'integer' OR refs < 0"
    ),
    "extents": (
        "SELECT inode, 'the extent at offset ' || quote(offset) || ' does not decode' "
        f"FROM {EXTENTS} WHERE typeof(inode) != 'integer' "
        "OR typeof(offset) != 'integer' OR typeof(length) != 'integer' OR length <= 0 "
        f"OR NOT ({_HEX_ID.format('chunk')}) OR typeof(chunk_offset) != 'integer' "
        "OR chunk_offset < 0"
    ),
}
"""Rows whose values cannot be what graben wrote: (inode or NULL, what is wrong)."""


def inconsistencies(db: sqlite3.Connection, path_of: PathOf, limit: int) -> list[ChunkProblem]:
    """Up to ``limit`` contradictions in the engine, as fsck problems of kind ``metadata``."""
    found: list[ChunkProblem] = []
    for problem in _all(db, path_of):
        found.append(problem)
        if len(found) >= limit:
            break
    return found


def _all(db: sqlite3.Connection, path_of: PathOf) -> Iterator[ChunkProblem]:
    yield from _engine(db)
    for table, sql in BAD_ROWS.items():
        for inode, what in db.execute(sql):
            yield _problem(table, what, path_of, inode)
    yield from _names(db, path_of)
    yield from _files(db, path_of)
    yield from _chunks(db, path_of)


def _problem(
    table: str, detail: str, path_of: PathOf, inode: object = None, chunk: str = ""
) -> ChunkProblem:
    path = path_of(inode) if type(inode) is int else None
    return ChunkProblem("metadata", chunk, f"engine: {table}", (path,) if path else (), detail)


def _engine(db: sqlite3.Connection) -> Iterator[ChunkProblem]:
    """SQLite's own verdict (b-trees, and indexes that disagree with their tables)."""
    for (line,) in db.execute("PRAGMA integrity_check(100)"):
        if line != "ok":
            yield ChunkProblem("metadata", "", "engine", (), f"SQLite integrity_check: {line}")


def _names(db: sqlite3.Connection, path_of: PathOf) -> Iterator[ChunkProblem]:
    rows = db.execute(
        f"SELECT e.parent, e.name, e.inode FROM {_table('entries', 'e')} "
        "WHERE e.inode NOT IN (SELECT id FROM inodes)"
    )
    for parent, name, inode in rows:
        path = f"{(path_of(parent) or f'<directory {parent}>').rstrip('/')}/{name}"
        detail = f"the entry {path} names inode {inode}, which does not exist (ls leaves it out)"
        yield ChunkProblem("metadata", "", "engine: entries", (path,), detail)
    rows = db.execute(
        f"SELECT e.parent, e.name FROM {_table('entries', 'e')} "
        "LEFT JOIN inodes p ON p.id = e.parent WHERE p.id IS NULL OR p.kind != 'directory'"
    )
    for parent, name in rows:
        detail = f"the entry {name!r} is in {parent!r}, which is not a directory"
        yield ChunkProblem("metadata", "", "engine: entries", (), detail)
    rows = db.execute(
        "SELECT id, kind, size FROM inodes WHERE id != 1 "
        # "+ 0": else SQLite answers the IN from the entries_by_inode index.
        f"AND id NOT IN (SELECT inode + 0 FROM {ENTRIES})"
    )
    for inode, kind, size in rows:
        detail = f"{kind} inode {inode} ({size} bytes) has no entry naming it"
        yield ChunkProblem("metadata", "", "engine: inodes", (), detail)


def _files(db: sqlite3.Connection, path_of: PathOf) -> Iterator[ChunkProblem]:
    """Extents that do not tile their file, or sit on a directory."""
    rows = db.execute(
        "SELECT i.id, i.kind, i.size, COALESCE(SUM(x.length), 0), COUNT(x.inode) "
        f"FROM inodes i LEFT JOIN {_table('extents', 'x')} ON x.inode = i.id GROUP BY i.id "
        "HAVING (i.kind = 'file' AND i.size != COALESCE(SUM(x.length), 0)) "
        "OR (i.kind = 'directory' AND COUNT(x.inode) > 0)"
    )
    for inode, kind, size, covered, count in rows:
        if kind == "directory":
            detail = f"directory inode {inode} has {count} extent(s)"
        else:
            detail = f"extents cover {covered} bytes but the file's size is {size}"
        yield _problem("extents", detail, path_of, inode)
    rows = db.execute(
        "SELECT inode, offset, expected FROM (SELECT inode, offset, "
        "LAG(offset + length, 1, 0) OVER (PARTITION BY inode ORDER BY offset) AS expected "
        f"FROM {EXTENTS}) WHERE offset != expected"
    )
    for inode, offset, expected in rows:
        detail = f"extents leave a gap or overlap at offset {expected} (next starts at {offset})"
        yield _problem("extents", detail, path_of, inode)


def _chunks(db: sqlite3.Connection, path_of: PathOf) -> Iterator[ChunkProblem]:
    """Extents without chunk rows, reference counts that do not match, extents past their chunk."""
    rows = db.execute(
        f"SELECT x.inode, x.offset, x.chunk FROM {_table('extents', 'x')} "
        "WHERE x.chunk NOT IN (SELECT id FROM chunks)"
    )
    for inode, offset, chunk in rows:
        detail = f"the extent at offset {offset} names chunk {chunk}, which has no chunk row"
        yield _problem("extents", detail, path_of, inode, str(chunk))
    rows = db.execute(
        f"WITH used AS (SELECT chunk, COUNT(*) AS n FROM {EXTENTS} GROUP BY chunk) "
        "SELECT c.id, c.refs, COALESCE(u.n, 0) FROM chunks c LEFT JOIN used u "
        "ON u.chunk = c.id WHERE c.refs != COALESCE(u.n, 0)"
    )
    for chunk, refs, used in rows:
        detail = f"chunk {chunk} counts {refs} refs but {used} extent(s) use it"
        yield _problem("chunks", detail, path_of, None, str(chunk))
    rows = db.execute(
        f"SELECT x.inode, x.offset, x.chunk FROM {_table('extents', 'x')} "
        "JOIN chunks c ON c.id = x.chunk WHERE x.chunk_offset + x.length > c.length"
    )
    for inode, offset, chunk in rows:
        detail = f"the extent at offset {offset} runs past the end of chunk {chunk}"
        yield _problem("extents", detail, path_of, inode, str(chunk))
    rows = db.execute("SELECT chunk, node FROM replicas WHERE chunk NOT IN (SELECT id FROM chunks)")
    for chunk, node in rows:
        detail = f"node {node} is said to hold chunk {chunk}, which has no chunk row"
        yield _problem("replicas", detail, path_of, None, str(chunk))
