"""Unlinks answered at once and removed in groups: ``rm -rf`` waits on no transaction.

An unlink the daemon can answer alone (the name is there, a file, in a place its
token may write: the kernel and ``_ops`` checked) is answered as soon as it is
queued here; so is an ``rmdir`` of a directory the daemon knows whole and empty
(``_names``: ``rm -rf`` listed it, then unlinked every name). One task removes
what is queued with one ``remove_each`` (one transaction, one round trip to a
cluster); what is queued meanwhile goes in the next, so a group grows with the
store's latency and adds none. Every other handler that reads or changes names
waits for ``settled`` first: the store sees the operations in the callers'
order, and a listing never shows a name unlinked.

A removal the store refuses after its unlink was answered (another client made
the name a directory, the cluster stayed out of reach past the client's
retries) is logged, and the name is back in the daemon's view, where the next
lookup finds it (so ``rmdir`` of its directory says "not empty").
"""

from __future__ import annotations

import asyncio
import errno
import logging
import posixpath
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence

import msgspec

from graben.store import FileInfo

from ._aio import Tasks

log = logging.getLogger("graben.fuse")

Remove = Callable[[Sequence[str], Sequence[bool]], Awaitable[list[BaseException | None]]]
"""Removes paths (each flagged: may it be a directory) in one call; for each, ``None`` or
why it did not go."""


class Removals:
    """The unlinks answered and not yet removed from the store."""

    def __init__(self, remove: Remove, back: Callable[[str], Awaitable[None]]) -> None:
        self._remove = remove
        self._back = back
        """Called for a path that did not go: the daemon's view gets the name back."""
        self._queued: list[tuple[str, bool]] = []
        self._pending: set[str] = set()
        self._in: Counter[str] = Counter()
        """Directories with names pending, and how many."""
        self._dirs_in: Counter[str] = Counter()
        """Directories with directories pending in them, and how many (their links)."""
        self._changed: dict[str, int] = {}
        """When a name in each directory with names pending last went (ns)."""
        self._task: asyncio.Task[None] | None = None
        self.groups = 0
        """Groups removed so far (for the tests and the metrics)."""

    def __contains__(self, path: str) -> bool:
        """Whether ``path`` was unlinked here and is not yet removed from the store."""
        return path in self._pending

    def add(self, path: str, tasks: Tasks, *, directory: bool = False) -> None:
        """Queue ``path``'s removal (its unlink, or rmdir, is answered now)."""
        self._queued.append((path, directory))
        self._pending.add(path)
        parent = posixpath.dirname(path)
        self._in[parent] += 1
        self._dirs_in[parent] += directory
        self._changed[parent] = time.time_ns()
        if self._task is None:
            self._task = tasks.start(self._run())

    def seen_in(self, directory: str, info: FileInfo) -> FileInfo | None:
        """The attributes of ``directory`` (``info``, from before) as its pending
        removals leave it: a newer mtime and ctime, a link fewer for each directory
        gone; ``None`` if none is pending in it. (The kernel asks for a directory's
        attributes after each unlink in it: answered here, ``rm -rf`` waits on none.)"""
        if not self._in[directory]:
            return None
        when = max(info.mtime_ns, self._changed[directory])
        links = info.nlink - self._dirs_in[directory]
        return msgspec.structs.replace(info, mtime_ns=when, ctime_ns=when, nlink=links)

    async def settled(self) -> None:
        """Wait until every unlink answered so far is removed from the store."""
        while self._task is not None:
            await asyncio.shield(self._task)

    async def _run(self) -> None:
        try:
            while self._queued:
                group, self._queued = self._queued, []
                paths = [path for path, _ in group]
                try:
                    outcomes = await self._remove(paths, [directory for _, directory in group])
                except Exception as exc:  # each path learns it below
                    outcomes = [exc] * len(group)
                self.groups += 1
                for (path, directory), outcome in zip(group, outcomes, strict=True):
                    self._pending.discard(path)
                    parent = posixpath.dirname(path)
                    self._in[parent] -= 1
                    self._dirs_in[parent] -= directory
                    if not self._in[parent]:
                        del self._in[parent], self._dirs_in[parent], self._changed[parent]
                    if outcome is not None and getattr(outcome, "errno", 0) != errno.ENOENT:
                        log.warning("%s: unlinked, but the store kept it: %s", path, outcome)
                        await self._back(path)
        finally:
            self._task = None
