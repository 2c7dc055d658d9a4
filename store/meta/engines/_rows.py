"""Engine rows as values, checked: what every engine shares.

Damage in an engine's tables (a flipped bit, a row edited behind graben's
back) must be a loud ``IntegrityError`` naming the inode and its path, never
a wrong answer; these are the checks both the SQLite and the PostgreSQL
engine apply to the rows they read.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..._errors import IntegrityError
from ..._types import ChunkRef, Extent
from .._repo import Inode, tiling_problem

PAGE_ROWS_MAX = 100_000
"""Rows one paged query returns at most, whatever it is asked (the wire's pages are far smaller)."""


def inode_of(row: tuple[object, ...] | None) -> Inode | None:
    """A row of ``inodes`` as a value; ``IntegrityError`` if it does not decode."""
    if row is None:
        return None
    number, kind, *numbers = row
    if (
        type(number) is not int
        or kind not in ("file", "directory")
        or any(type(n) is not int for n in numbers)
    ):
        raise IntegrityError(f"metadata damaged: inode row {row!r} does not decode")
    return Inode(number, kind, *numbers)  # type: ignore[arg-type]


def checked_inode(row: tuple[object, ...]) -> Inode:
    found = inode_of(row)
    assert found is not None
    return found


def chunk_ref(chunk: object, length: object, crc: object) -> ChunkRef | None:
    """A chunk row as a value, or ``None`` if it does not decode."""
    ok = (
        isinstance(chunk, str)
        and len(chunk) == 64
        and type(length) is int
        and length >= 0
        and type(crc) is int
    )
    return ChunkRef(chunk, length, crc) if ok else None  # type: ignore[arg-type]


class CheckedRows:
    """Row checks for a transaction class that can name an inode's path."""

    def path_of(self, inode: int) -> str | None:
        raise NotImplementedError

    def _damaged(self, inode: int, problem: str) -> IntegrityError:
        """The error for a file whose rows contradict each other, naming it."""
        where = self.path_of(inode) or f"inode {inode} (no path names it)"
        return IntegrityError(f"metadata damaged: {problem} (inode {inode})", where)

    def _extent(
        self, inode: int, offset: object, length: object, chunk: object, *rest: object
    ) -> Extent:
        """One ``extents`` row (joined with its chunk row) as a value, or ``IntegrityError``."""
        if not isinstance(chunk, str) or rest[0] is None:
            raise self._damaged(
                inode,
                f"the extent at offset {offset} names chunk {chunk!r}, which has no chunk row",
            )
        ref = chunk_ref(chunk, *rest[:2])
        chunk_offset = rest[2]
        if (
            ref is None
            or type(offset) is not int
            or type(length) is not int
            or type(chunk_offset) is not int
        ):
            raise self._damaged(inode, f"the extent at offset {offset!r} does not decode")
        return Extent(offset, length, ref, chunk_offset)

    def _tiled(
        self, inode: int, extents: list[Extent], size: Sequence[object] | None
    ) -> list[Extent]:
        """A whole file's extents, if they tile its size (the inode row's ``size``)."""
        length = size[0] if size else 0
        problem = tiling_problem(length if isinstance(length, int) else -1, extents)
        if problem is not None:
            raise self._damaged(inode, f"{problem}; the file's size says {length}")
        return extents
