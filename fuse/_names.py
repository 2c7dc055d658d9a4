"""Directories whose every name the daemon knows: a new name is "not there" at once.

Creating a file asks the kernel's ``lookup`` first, while the kernel holds the
directory's lock, so writers in one directory wait on each other's lookups.
For a directory it made or listed whole, the daemon answers a lookup of a name
it does not hold with ``ENOENT`` from memory, not from the store.

The sets may hold names that are gone (a name is dropped only once the store
removed it); they never lack one that is there, as far as the change feed
tells: a name another client made in a held directory, or on the way to a
path it wrote (a write makes the directories above it), drops that directory
(``elsewhere``), as does a feed that cannot be followed. A listing taken
while such a drop happened is not kept (``mark``/``hold``). What another
client wrote in the last ~0.2 s may still look missing here, as the
kernel's caches may. A pure core.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable

MAX_DIRS = 4096
"""Directories held at once (the oldest go first)."""
MAX_NAMES = 100_000
"""A directory with more names is not held."""


class WholeDirs:
    """Directory paths with all their names."""

    def __init__(self) -> None:
        self._names: dict[str, set[str]] = {}
        self.drops = 0
        """Changes elsewhere seen so far (``mark``)."""

    def __len__(self) -> int:
        return len(self._names)

    def mark(self) -> int:
        """Taken before listing a directory; ``hold`` keeps the listing only if no change
        elsewhere was seen meanwhile."""
        return self.drops

    def hold(self, path: str, names: Iterable[str], since: int) -> None:
        """``names`` are all of the directory ``path``'s (listed after ``mark`` gave
        ``since``)."""
        held = set(names)
        if since != self.drops or len(held) > MAX_NAMES:
            return
        self._names.pop(path, None)
        while len(self._names) >= MAX_DIRS:
            del self._names[next(iter(self._names))]
        self._names[path] = held

    def lacks(self, path: str) -> bool:
        """Whether ``path`` is surely not there: its directory is held without it."""
        parent, name = posixpath.split(path)
        names = self._names.get(parent)
        return names is not None and name not in names

    def empty(self, path: str) -> bool:
        """Whether the directory ``path`` is held, with no name in it."""
        return self._names.get(path) == set()

    def added(self, path: str) -> None:
        """This mount made ``path`` (a file, directory, link or node)."""
        parent, name = posixpath.split(path)
        names = self._names.get(parent)
        if names is not None:
            names.add(name)

    def removed(self, path: str) -> None:
        """This mount removed ``path`` (the store has)."""
        parent, name = posixpath.split(path)
        names = self._names.get(parent)
        if names is not None:
            names.discard(name)
        self._names.pop(path, None)

    def moved(self, old: str, new: str) -> None:
        """This mount renamed ``old`` to ``new``."""
        held = self._names.pop(old, None)
        self.removed(old)
        self.removed(new)
        self.added(new)
        if held is not None:
            self._names[new] = held

    def elsewhere(self, path: str, there: bool) -> None:
        """Another client changed ``path`` (``there``: a name is there now). A held
        directory on the way that lacks a name of it is dropped (the write may have made
        the directories above it); ``path`` itself, if held, may be another directory."""
        self.drops += 1  # a listing under way may have missed it
        self._names.pop(path, None)
        while there and path != "/":
            path, name = posixpath.split(path)
            names = self._names.get(path)
            if names is not None and name not in names:
                del self._names[path]

    def clear(self) -> None:
        """Nothing is known any more (the feed was lost)."""
        self.drops += 1
        self._names.clear()
