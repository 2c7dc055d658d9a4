"""fsck of an engine itself: where its tables contradict each other, written once.

A flipped bit in a database usually leaves its b-trees well formed, so the
engine's own checks pass, while a value changes: an entry names an inode
that is not there (``ls`` silently shows one file fewer), an extent names a
chunk without a row, a chunk's reference count stops matching the extents
that use it (and collection would delete a live chunk). Each query below
looks for one such contradiction, in SQL both engines speak. They must read
the tables themselves, not the indexes, which may still hold the value from
before the damage: each engine says how to name a table so (``Dialect``)
and adds its own verdict (SQLite's ``integrity_check``, PostgreSQL's
``amcheck``) and the rows its column types let through (``bad_rows``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..._types import ChunkProblem
from .._repo import ROOT_INODE
from ._sums import SUMMED, expression

PathOf = Callable[[int], str | None]


@dataclass(frozen=True, slots=True)
class Dialect:
    """What the cross-checks need of an engine."""

    rows: Callable[[str], list[tuple[Any, ...]]]
    """Run a query (no parameters); its rows."""
    table: Callable[[str, str], str]
    """``(table, alias)`` -> how to name it so that it is read itself, not an index."""
    bad_rows: Mapping[str, str]
    """Per table, a query for rows no graben wrote: (inode or NULL, what is wrong)."""
    engine: Callable[[], Iterator[ChunkProblem]]
    """The engine's own verdict on its files and indexes."""


def inconsistencies(dialect: Dialect, path_of: PathOf, limit: int) -> list[ChunkProblem]:
    """Up to ``limit`` contradictions in the engine, as fsck problems of kind ``metadata``."""
    found: list[ChunkProblem] = []
    for problem in _all(dialect, path_of):
        found.append(problem)
        if len(found) >= limit:
            break
    return found


def _all(d: Dialect, path_of: PathOf) -> Iterator[ChunkProblem]:
    yield from d.engine()
    for table, query in d.bad_rows.items():
        for inode, what in d.rows(query):
            yield problem(table, what, path_of, inode)
    yield from _sums(d, path_of)
    yield from _names(d, path_of)
    yield from _files(d, path_of)
    yield from _chunks(d, path_of)


def problem(
    table: str, detail: str, path_of: PathOf, inode: object = None, chunk: str = ""
) -> ChunkProblem:
    """One contradiction, naming the file's path where the inode has one."""
    path = path_of(inode) if type(inode) is int else None
    return ChunkProblem("metadata", chunk, f"engine: {table}", (path,) if path else (), detail)


SUM_OWNER = {"inodes": "id", "entries": "inode", "extents": "inode", "chunks": "NULL"}
"""The inode a summed table's row belongs to, to name its path."""


def _sums(d: Dialect, path_of: PathOf) -> Iterator[ChunkProblem]:
    """Rows whose values no longer match their checksum (a value nothing else repeats,
    such as a time or a name, changed since graben wrote it)."""
    for table in SUMMED:
        key = ", ".join(SUMMED[table][:2])
        # ``inodes`` has a rowid on both engines: a scan of it reads it itself.
        source = table if table == "inodes" else d.table(table, "")
        rows = d.rows(
            f"SELECT {SUM_OWNER[table]}, {key} FROM {source} "
            f"WHERE NOT COALESCE(sum = {expression(table)}, FALSE)"
        )
        for owner, *values in rows:
            detail = f"the {table} row ({', '.join(map(repr, values))}) does not match its checksum"
            chunk = str(values[0]) if table == "chunks" else ""
            yield problem(table, detail, path_of, owner, chunk)


def _names(d: Dialect, path_of: PathOf) -> Iterator[ChunkProblem]:
    entries = d.table("entries", "e")
    rows = d.rows(
        f"SELECT e.parent, e.name, e.inode FROM {entries} "
        "WHERE e.inode NOT IN (SELECT id FROM inodes)"
    )
    for parent, name, inode in rows:
        path = f"{(path_of(parent) or f'<directory {parent}>').rstrip('/')}/{name}"
        detail = f"the entry {path} names inode {inode}, which does not exist (ls leaves it out)"
        yield ChunkProblem("metadata", "", "engine: entries", (path,), detail)
    rows = d.rows(
        f"SELECT e.parent, e.name FROM {entries} "
        "LEFT JOIN inodes p ON p.id = e.parent WHERE p.id IS NULL OR p.kind != 'directory'"
    )
    for parent, name in rows:
        detail = f"the entry {name!r} is in {parent!r}, which is not a directory"
        yield ChunkProblem("metadata", "", "engine: entries", (), detail)
    rows = d.rows(
        f"SELECT id, kind, size FROM inodes WHERE id != {ROOT_INODE} "
        # "+ 0": else SQLite answers the IN from the entries_by_inode index.
        f"AND id NOT IN (SELECT inode + 0 FROM {d.table('entries', '')})"
    )
    for inode, kind, size in rows:
        detail = f"{kind} inode {inode} ({size} bytes) has no entry naming it"
        yield ChunkProblem("metadata", "", "engine: inodes", (), detail)


def _files(d: Dialect, path_of: PathOf) -> Iterator[ChunkProblem]:
    """Extents that do not tile their file, or sit on a directory."""
    rows = d.rows(
        "SELECT i.id, i.kind, i.size, COALESCE(SUM(x.length), 0), COUNT(x.inode) "
        f"FROM inodes i LEFT JOIN {d.table('extents', 'x')} ON x.inode = i.id GROUP BY i.id "
        "HAVING (i.kind = 'file' AND i.size != COALESCE(SUM(x.length), 0)) "
        "OR (i.kind = 'directory' AND COUNT(x.inode) > 0)"
    )
    for inode, kind, size, covered, count in rows:
        if kind == "directory":
            detail = f"directory inode {inode} has {count} extent(s)"
        else:
            detail = f"extents cover {covered} bytes but the file's size is {size}"
        yield problem("extents", detail, path_of, inode)
    rows = d.rows(
        'SELECT inode, "offset", expected FROM (SELECT inode, "offset", '
        'LAG("offset" + length, 1, CAST(0 AS BIGINT)) OVER (PARTITION BY inode ORDER BY "offset") '
        f'AS expected FROM {d.table("extents", "")}) AS s WHERE "offset" != expected'
    )
    for inode, offset, expected in rows:
        detail = f"extents leave a gap or overlap at offset {expected} (next starts at {offset})"
        yield problem("extents", detail, path_of, inode)


def _chunks(d: Dialect, path_of: PathOf) -> Iterator[ChunkProblem]:
    """Extents without chunk rows, reference counts that do not match, extents past their chunk."""
    extents = d.table("extents", "x")
    rows = d.rows(
        f'SELECT x.inode, x."offset", x.chunk FROM {extents} '
        "WHERE x.chunk NOT IN (SELECT id FROM chunks)"
    )
    for inode, offset, chunk in rows:
        detail = f"the extent at offset {offset} names chunk {chunk}, which has no chunk row"
        yield problem("extents", detail, path_of, inode, str(chunk))
    rows = d.rows(
        f"WITH used AS (SELECT chunk, COUNT(*) AS n FROM {d.table('extents', '')} GROUP BY chunk) "
        "SELECT c.id, c.refs, COALESCE(u.n, 0) FROM chunks c LEFT JOIN used u "
        "ON u.chunk = c.id WHERE c.refs != COALESCE(u.n, 0)"
    )
    for chunk, refs, used in rows:
        detail = f"chunk {chunk} counts {refs} refs but {used} extent(s) use it"
        yield problem("chunks", detail, path_of, None, str(chunk))
    rows = d.rows(
        f'SELECT x.inode, x."offset", x.chunk FROM {extents} '
        "JOIN chunks c ON c.id = x.chunk WHERE x.chunk_offset + x.length > c.length"
    )
    for inode, offset, chunk in rows:
        detail = f"the extent at offset {offset} runs past the end of chunk {chunk}"
        yield problem("extents", detail, path_of, inode, str(chunk))
    # A table with a rowid on both engines: a scan of it reads it itself.
    rows = d.rows(
        "SELECT b.id, LENGTH(b.data), c.length FROM chunk_bytes b "
        "LEFT JOIN chunks c ON c.id = b.id WHERE c.id IS NULL OR c.length != LENGTH(b.data)"
    )
    for chunk, held, length in rows:
        if length is None:
            detail = f"the engine keeps {held} bytes of chunk {chunk}, which has no chunk row"
        else:
            detail = f"the engine keeps {held} bytes of chunk {chunk}, which is {length} long"
        yield problem("chunk_bytes", detail, path_of, None, str(chunk))
    rows = d.rows("SELECT chunk, node FROM replicas WHERE chunk NOT IN (SELECT id FROM chunks)")
    for chunk, node in rows:
        detail = f"node {node} is said to hold chunk {chunk}, which has no chunk row"
        yield problem("replicas", detail, path_of, None, str(chunk))
