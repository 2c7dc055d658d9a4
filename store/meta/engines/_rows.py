"""Engine rows as values, checked: what every engine shares.

Damage in an engine's tables (a flipped bit, a row edited behind graben's
back) must be a loud ``IntegrityError`` naming the inode and its path, never
a wrong answer; these are the checks both the SQLite and the PostgreSQL
engine apply to the rows they read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..._errors import IntegrityError
from ..._types import ChunkRef, Extent
from .._repo import INODE_COLUMNS, Inode, tiling_problem
from ._sums import row_sum

INODE_ROW = INODE_COLUMNS + ", sum"
"""An inode's columns as read: its values, then its checksum (``_sums.py``)."""
CHANGED = "a value changed since graben wrote it"
PathOf = Callable[[int], "str | None"]
PAGE_ROWS_MAX = 100_000
"""Rows one paged query returns at most, whatever it is asked (the wire's pages are far smaller)."""


def inode_of(row: tuple[object, ...] | None, path_of: PathOf | None = None) -> Inode | None:
    """A row of ``inodes`` (``INODE_ROW``: its values, then its sum) as a value;
    ``IntegrityError`` (naming its path, given ``path_of``) if it does not decode or its
    sum differs."""
    if row is None:
        return None
    *values, total = row
    number, kind, *numbers = values
    if (
        type(number) is not int
        or kind not in ("file", "directory")
        or any(type(n) is not int for n in numbers)
    ):
        raise IntegrityError(f"metadata damaged: inode row {row!r} does not decode")
    if row_sum(*values) != total:
        raise IntegrityError(
            f"metadata damaged: the row of inode {number} does not match its checksum ({CHANGED})",
            (path_of and path_of(number)) or None,
        )
    return Inode(number, kind, *numbers)  # type: ignore[arg-type]


def checked_inode(row: tuple[object, ...], path_of: PathOf | None = None) -> Inode:
    found = inode_of(row, path_of)
    assert found is not None
    return found


def entry_of(
    parent: object, name: object, row: tuple[object, ...], path_of: PathOf | None = None
) -> Inode:
    """A name's inode from ``e.sum, JOINED_INODE``, the entry's sum checked too."""
    node = checked_inode(row[1:], path_of)
    check_entry(parent, name, node.id, row[0], path_of)
    return node


def named_entry(
    parent: object, name: object, row: tuple[object, ...], path_of: PathOf | None = None
) -> Inode:
    """A name's inode from ``e.sum, e.inode, JOINED_INODE`` of a LEFT JOIN: an entry that
    names an inode with no row is damage, never a name left out."""
    if row[2] is None:
        check_entry(parent, name, row[1], row[0], path_of)
        above = path_of(parent) if path_of and type(parent) is int else None
        raise IntegrityError(
            f"metadata damaged: the entry {name!r} of directory {parent} names inode "
            f"{row[1]}, which does not exist (run fsck)",
            f"{above.rstrip('/')}/{name}" if above else None,
        )
    return entry_of(parent, name, (row[0], *row[2:]), path_of)


def check_entry(
    parent: object, name: object, inode: object, total: object, path_of: PathOf | None = None
) -> None:
    """``IntegrityError`` unless an ``entries`` row's values match its sum."""
    if row_sum(parent, name, inode) != total:
        above = path_of(parent) if path_of and type(parent) is int else None
        raise IntegrityError(
            f"metadata damaged: the entry {name!r} of directory {parent} does not match "
            f"its checksum ({CHANGED})",
            f"{above.rstrip('/')}/{name}" if above else None,
        )


def chunk_ref(chunk: object, length: object, crc: object, total: object) -> ChunkRef | None:
    """A chunk row (``id, length, crc32c, sum``) as a value, or ``None`` if it does not
    decode or its sum differs."""
    ok = (
        isinstance(chunk, str)
        and len(chunk) == 64
        and type(length) is int
        and length >= 0
        and type(crc) is int
        and row_sum(chunk, length, crc) == total
    )
    return ChunkRef(chunk, length, crc) if ok else None  # type: ignore[arg-type]


def damaged(inode: int, problem: str, path_of: PathOf) -> IntegrityError:
    """The error for a file whose rows contradict each other, naming it."""
    where = path_of(inode) or f"inode {inode} (no path names it)"
    return IntegrityError(f"metadata damaged: {problem} (inode {inode})", where)


def extent_of(inode: int, row: Sequence[object], path_of: PathOf) -> Extent:
    """One ``extents`` row joined with its chunk row (``EXTENT_ROWS``: the extent's offset,
    length and chunk, the chunk's length and crc32c, the extent's chunk offset, the two
    rows' sums) as a value, or ``IntegrityError``."""
    offset, length, chunk, chunk_length, crc, chunk_offset, total, chunk_total = row
    if not isinstance(chunk, str) or chunk_length is None:
        raise damaged(
            inode,
            f"the extent at offset {offset} names chunk {chunk!r}, which has no chunk row",
            path_of,
        )
    ref = chunk_ref(chunk, chunk_length, crc, chunk_total)
    if (
        ref is None
        or type(offset) is not int
        or type(length) is not int
        or type(chunk_offset) is not int
    ):
        raise damaged(inode, f"the extent at offset {offset!r} does not decode", path_of)
    if row_sum(inode, offset, length, chunk, chunk_offset) != total:
        raise damaged(inode, f"the extent at offset {offset} does not match its checksum", path_of)
    return Extent(offset, length, ref, chunk_offset)


def tiled(
    inode: int, extents: list[Extent], size: Sequence[object] | None, path_of: PathOf
) -> list[Extent]:
    """A whole file's extents, if they tile its size (the inode row's ``size``)."""
    length = size[0] if size else 0
    problem = tiling_problem(length if isinstance(length, int) else -1, extents)
    if problem is not None:
        raise damaged(inode, f"{problem}; the file's size says {length}", path_of)
    return extents
