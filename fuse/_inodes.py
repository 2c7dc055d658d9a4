"""Inode numbers for paths: the kernel speaks inodes, the store speaks paths.

The store's own inode changes with every committed version of a file, but the
kernel expects an inode to name one file for as long as it remembers it. So the
mount numbers paths itself: a path keeps its number while the kernel holds a
lookup on it (a rename carries the number, and every number below a renamed
directory, along), and forgets it when the kernel does. A pure core: no I/O.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from dataclasses import dataclass

ROOT = 1
"""The root directory's inode (FUSE's ``FUSE_ROOT_ID``)."""


@dataclass(slots=True)
class _Entry:
    path: str
    lookups: int


class InodeTable:
    """Paths and their inode numbers, with the kernel's lookup counts."""

    def __init__(self) -> None:
        self._by_inode: dict[int, _Entry] = {ROOT: _Entry("/", 1)}
        self._by_path: dict[str, int] = {"/": ROOT}
        self._next = ROOT + 1

    def __len__(self) -> int:
        return len(self._by_inode)

    def path(self, inode: int) -> str:
        """The path an inode names; ``KeyError`` if the kernel forgot it."""
        return self._by_inode[inode].path

    @staticmethod
    def child(parent: str, name: str) -> str:
        """The path of ``name`` in the directory at ``parent``."""
        return posixpath.join(parent, name)

    def peek(self, path: str) -> int | None:
        """The inode of ``path`` if it has one, without counting a lookup."""
        return self._by_path.get(path)

    def number(self, path: str) -> int:
        """The inode of ``path``, numbered now if new, without counting a lookup."""
        inode = self._by_path.get(path)
        if inode is None:
            inode, self._next = self._next, self._next + 1
            self._by_inode[inode] = _Entry(path, 0)
            self._by_path[path] = inode
        return inode

    def lookup(self, path: str) -> int:
        """The inode of ``path``, with one more lookup counted (as the kernel now holds it)."""
        inode = self.number(path)
        self._by_inode[inode].lookups += 1
        return inode

    def forget(self, inode: int, count: int) -> None:
        """The kernel dropped ``count`` lookups; an inode at zero is gone."""
        entry = self._by_inode.get(inode)
        if entry is None or inode == ROOT:
            return
        entry.lookups -= count
        if entry.lookups <= 0:
            del self._by_inode[inode]
            if self._by_path.get(entry.path) == inode:
                del self._by_path[entry.path]

    def moved(self, old: str, new: str) -> None:
        """``old`` was renamed to ``new``: its inode, and those below it, follow."""
        displaced = self._by_path.pop(new, None)
        if displaced is not None and displaced != self._by_path.get(old):
            self._detach(displaced)
        for inode, path in list(self._below(old)):
            del self._by_path[path]
            moved = new + path[len(old) :]
            self._by_inode[inode].path = moved
            self._by_path[moved] = inode

    def removed(self, path: str) -> None:
        """``path`` was unlinked: its number is kept only for the kernel's open handles."""
        inode = self._by_path.pop(path, None)
        if inode is not None:
            self._detach(inode)

    def _detach(self, inode: int) -> None:
        # The inode lives on until forgotten, but no path leads to it: give it
        # a name no store path can have, so it cannot be mistaken for a live one.
        self._by_inode[inode].path = f"\0unlinked/{inode}"

    def _below(self, top: str) -> Iterator[tuple[int, str]]:
        prefix = top.rstrip("/") + "/"
        for path, inode in self._by_path.items():
            if path == top or path.startswith(prefix):
                yield inode, path


def is_unlinked(path: str) -> bool:
    """Whether a path from the table names an unlinked inode."""
    return path.startswith("\0")
