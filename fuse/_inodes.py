"""Inode numbers for paths: the kernel speaks inodes, the store speaks paths.

The store's own inode changes with every committed version of a file, but the
kernel expects an inode to name one file for as long as it remembers it. So the
mount numbers paths itself: a path keeps its number while the kernel holds a
lookup on it (a rename carries the number, and every number below a renamed
directory, along), and forgets it when the kernel does. A file with several
names (hard links) has one number for all the names the mount has seen: the
names are found by the store's inode of the file. A pure core: no I/O.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from dataclasses import dataclass, field

ROOT = 1
"""The root directory's inode (FUSE's ``FUSE_ROOT_ID``)."""


@dataclass(slots=True)
class _Entry:
    path: str
    """The name store calls use (any of its names would do)."""
    lookups: int
    others: list[str] = field(default_factory=list)
    """Its other names (hard links) the mount has seen."""
    file: int = 0
    """The store's inode of a file with several names (0: not known to have several)."""

    def names(self) -> list[str]:
        return [self.path, *self.others]


class InodeTable:
    """Paths and their inode numbers, with the kernel's lookup counts."""

    def __init__(self) -> None:
        self._by_inode: dict[int, _Entry] = {ROOT: _Entry("/", 1)}
        self._by_path: dict[str, int] = {"/": ROOT}
        self._by_file: dict[int, int] = {}
        self._next = ROOT + 1

    def __len__(self) -> int:
        return len(self._by_inode)

    def __contains__(self, inode: int) -> bool:
        return inode in self._by_inode

    def known(self) -> list[tuple[str, int]]:
        """Every path the table has, with its inode."""
        return list(self._by_path.items())

    def path(self, inode: int) -> str:
        """The path an inode names; ``KeyError`` if the kernel forgot it."""
        return self._by_inode[inode].path

    def names(self, inode: int) -> int:
        """How many of the inode's names the mount knows."""
        entry = self._by_inode.get(inode)
        return 0 if entry is None or is_unlinked(entry.path) else len(entry.names())

    @staticmethod
    def child(parent: str, name: str) -> str:
        """The path of ``name`` in the directory at ``parent``."""
        return posixpath.join(parent, name)

    def peek(self, path: str) -> int | None:
        """The inode of ``path`` if it has one, without counting a lookup."""
        return self._by_path.get(path)

    def number(self, path: str, file: int = 0) -> int:
        """The inode of ``path``, numbered now if new, without counting a lookup.

        ``file`` (the store's inode of a file with several names) gives a new
        path the number another of the file's names has.
        """
        inode = self._by_path.get(path)
        if inode is None and file and file in self._by_file:
            inode = self._by_file[file]
            self.alias(path, inode)
        if inode is None:
            inode, self._next = self._next, self._next + 1
            self._by_inode[inode] = _Entry(path, 0)
            self._by_path[path] = inode
        if file:
            self._by_inode[inode].file = file
            self._by_file[file] = inode
        return inode

    def lookup(self, path: str, file: int = 0) -> int:
        """The inode of ``path``, with one more lookup counted (as the kernel now holds it)."""
        inode = self.number(path, file)
        self._by_inode[inode].lookups += 1
        return inode

    def alias(self, path: str, inode: int) -> None:
        """``path`` is another name of ``inode`` (a hard link)."""
        entry = self._by_inode[inode]
        if self._by_path.get(path) == inode:
            return
        self.removed(path)
        if is_unlinked(entry.path):
            entry.path = path
        else:
            entry.others.append(path)
        self._by_path[path] = inode

    def forget(self, inode: int, count: int) -> None:
        """The kernel dropped ``count`` lookups; an inode at zero is gone."""
        entry = self._by_inode.get(inode)
        if entry is None or inode == ROOT:
            return
        entry.lookups -= count
        if entry.lookups <= 0:
            del self._by_inode[inode]
            for path in entry.names():
                if self._by_path.get(path) == inode:
                    del self._by_path[path]
            if entry.file and self._by_file.get(entry.file) == inode:
                del self._by_file[entry.file]

    def moved(self, old: str, new: str) -> None:
        """``old`` was renamed to ``new``: its inode, and those below it, follow."""
        displaced = self._by_path.get(new)
        if displaced is not None and displaced != self._by_path.get(old):
            self.removed(new)
        for inode, path in list(self._below(old)):
            del self._by_path[path]
            moved = new + path[len(old) :]
            entry = self._by_inode[inode]
            if entry.path == path:
                entry.path = moved
            else:
                entry.others[entry.others.index(path)] = moved
            self._by_path[moved] = inode

    def removed(self, path: str) -> None:
        """``path`` was unlinked: an inode left without a name is kept only for the
        kernel's open handles."""
        inode = self._by_path.pop(path, None)
        if inode is None:
            return
        entry = self._by_inode[inode]
        if path in entry.others:
            entry.others.remove(path)
        elif entry.others:
            entry.path = entry.others.pop(0)
        else:
            # The inode lives on until forgotten, but no path leads to it: give it
            # a name no store path can have, so it cannot be mistaken for a live one.
            entry.path = f"\0unlinked/{inode}"

    def _below(self, top: str) -> Iterator[tuple[int, str]]:
        prefix = top.rstrip("/") + "/"
        for path, inode in self._by_path.items():
            if path == top or path.startswith(prefix):
                yield inode, path


def is_unlinked(path: str) -> bool:
    """Whether a path from the table names an unlinked inode."""
    return path.startswith("\0")
