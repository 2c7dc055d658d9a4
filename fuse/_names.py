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
from typing import Any, Generic, TypeVar

E = TypeVar("E")

MAX_DIRS = 4096
"""Directories held at once (the oldest go first)."""
MAX_NAMES = 100_000
"""A directory with more names is not held."""


class WholeDirs:
    """Directory paths with all their names."""

    def __init__(self, listings: Listings[Any] | None = None) -> None:
        self._names: dict[str, set[str]] = {}
        self.drops = 0
        """Changes elsewhere seen so far (``mark``)."""
        self.listings = listings if listings is not None else Listings()
        """The listings kept, told of every change here as the names are."""

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
        self.listings.touch(path)
        parent, name = posixpath.split(path)
        names = self._names.get(parent)
        if names is not None:
            names.add(name)

    def removed(self, path: str) -> None:
        """This mount removed ``path`` (the store has)."""
        self.listings.touch(path)
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
        self.listings.clear()
        self._names.pop(path, None)
        while there and path != "/":
            path, name = posixpath.split(path)
            names = self._names.get(path)
            if names is not None and name not in names:
                del self._names[path]

    def clear(self) -> None:
        """Nothing is known any more (the feed was lost)."""
        self.drops += 1
        self.listings.clear()
        self._names.clear()


MAX_LISTED = 50_000
"""Entries of kept listings at once (the oldest directories' go first)."""
MAX_TOUCHED = 100_000
"""Paths changed here remembered at once; past it every listing is let go."""


class Listings(Generic[E]):
    """Directory listings as the store gave them, answered again without asking it
    (``find``, ``du``, ``tar c``, ``git status`` list every directory of a tree, often
    twice) while nothing could have changed them.

    A listing holds each name's attributes, so any change made here at a path makes
    the listings of the path, of its directory and of the directory above that (whose
    entry for it holds its mtime and links) out of date (``touch``); any change made
    elsewhere, or a change feed lost, lets every listing go (``clear``). A listing
    read from the store while either happened is not kept (``mark``/``keep``).
    """

    def __init__(self) -> None:
        self._kept: dict[str, tuple[int, list[E]]] = {}
        self._touched: dict[str, int] = {}
        self._tick = 0
        self._entries = 0

    def __len__(self) -> int:
        return len(self._kept)

    def mark(self) -> int:
        """Taken before reading a listing from the store, for ``keep``."""
        return self._tick

    def keep(self, path: str, entries: list[E], since: int) -> None:
        """``entries`` are the directory ``path``'s, read after ``mark`` gave ``since``."""
        if since != self._tick or len(entries) > MAX_LISTED:
            return
        self._drop(path)
        while self._kept and self._entries + len(entries) > MAX_LISTED:
            self._drop(next(iter(self._kept)))
        self._kept[path] = (self._tick, entries)
        self._entries += len(entries)

    def get(self, path: str) -> list[E] | None:
        """The kept listing of ``path``, if nothing changed it since it was read."""
        kept = self._kept.get(path)
        if kept is None:
            return None
        if self._touched.get(path, 0) > kept[0]:
            self._drop(path)
            return None
        return kept[1]

    def touch(self, path: str) -> None:
        """This mount changed ``path`` (made, removed, renamed it, or its attributes)."""
        self._tick += 1
        if len(self._touched) >= MAX_TOUCHED:
            self.clear()
        for _ in range(3):
            self._touched[path] = self._tick
            if path == "/":
                break
            path = posixpath.dirname(path)

    def clear(self) -> None:
        """Another client changed something, or its changes can no longer be told."""
        self._tick += 1
        self._kept.clear()
        self._touched.clear()
        self._entries = 0

    def _drop(self, path: str) -> None:
        kept = self._kept.pop(path, None)
        if kept is not None:
            self._entries -= len(kept[1])
