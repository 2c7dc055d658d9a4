"""fsck of the SQLite engine: the shared cross-checks (``_checks.py``) in SQLite's words.

SQLite stores any value in any column, so rows are also checked for the
types graben writes (``BAD_ROWS``). The checks read the tables themselves:
``NOT INDEXED`` is not enough (a WITHOUT ROWID table is still scanned
through a covering index), so the primary key is named; ``PRAGMA
integrity_check`` then reports indexes that disagree with their tables.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from functools import partial

from ..._types import ChunkProblem
from ._checks import Dialect, PathOf
from ._checks import inconsistencies as _inconsistencies


def _table(name: str, alias: str = "") -> str:
    """A WITHOUT ROWID table read through its primary key, never another index of its."""
    return f"{name}{f' AS {alias}' if alias else ''} INDEXED BY sqlite_autoindex_{name}_1"


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
        f"' does not decode' FROM {_table('entries')} WHERE typeof(parent) != 'integer' "
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
        f"FROM {_table('extents')} WHERE typeof(inode) != 'integer' "
        "OR typeof(offset) != 'integer' OR typeof(length) != 'integer' OR length <= 0 "
        f"OR NOT ({_HEX_ID.format('chunk')}) OR typeof(chunk_offset) != 'integer' "
        "OR chunk_offset < 0"
    ),
    "chunk_bytes": (
        "SELECT NULL, 'the kept bytes of chunk ' || quote(id) || ' do not decode' "
        f"FROM chunk_bytes WHERE NOT ({_HEX_ID.format('id')}) OR typeof(data) != 'blob'"
    ),
}
"""Rows whose values cannot be what graben wrote: (inode or NULL, what is wrong)."""


def inconsistencies(db: sqlite3.Connection, path_of: PathOf, limit: int) -> list[ChunkProblem]:
    """Up to ``limit`` contradictions in the engine, as fsck problems of kind ``metadata``."""
    dialect = Dialect(
        rows=lambda query: db.execute(query).fetchall(),
        table=_table,
        bad_rows=BAD_ROWS,
        engine=partial(_engine, db),
    )
    return _inconsistencies(dialect, path_of, limit)


def _engine(db: sqlite3.Connection) -> Iterator[ChunkProblem]:
    """SQLite's own verdict (b-trees, and indexes that disagree with their tables)."""
    for (line,) in db.execute("PRAGMA integrity_check(100)"):
        if line != "ok":
            yield ChunkProblem("metadata", "", "engine", (), f"SQLite integrity_check: {line}")
