"""Changes answered at once and sent in groups: ``rm -rf``, ``chmod -R`` wait on no
transaction.

An unlink the daemon can answer alone (the name is there, a file, in a place its
token may write: the kernel and ``_ops`` checked) is answered as soon as it is
queued here; so is an ``rmdir`` of a directory the daemon knows whole and empty
(``_names``: ``rm -rf`` listed it, then unlinked every name), and a ``chmod``,
``chown`` or ``touch`` of a path with no open file, answered with the attributes
the store will give it (``changed``). One task sends what is queued, each run of
one kind in one call (``remove_each``, ``set_attributes_each``: one
transaction, one round trip to a cluster); what is queued meanwhile goes in the
next, so a group grows with the store's latency and adds none. Every other
handler that reads or changes names waits for ``settled`` first: the store sees
the operations in the callers' order, and a listing never shows a name unlinked.

A change the store refuses after it was answered (another client put a name in
the directory, made the file a directory, removed it) is logged, and the
daemon's view follows the store: a name comes back, so the next lookup finds it
and ``rmdir`` of its directory says "not empty"; attributes are asked again.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import posixpath
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import msgspec

from graben.store import Change, FileInfo

from ._aio import Tasks

log = logging.getLogger("graben.fuse")

Remove = Callable[[Sequence[str], Sequence[bool]], Awaitable[list[BaseException | None]]]
"""Removes paths (each flagged: may it be a directory) in one call; for each, ``None`` or
why it did not go."""
SetAttributes = Callable[
    [Sequence[tuple[str, Change]]], Awaitable[Sequence[FileInfo | BaseException]]
]
"""Changes attributes of paths in one call; for each, what it is now or why not."""


@dataclass(frozen=True, slots=True)
class Removal:
    path: str
    directory: bool


@dataclass(frozen=True, slots=True)
class Attributes:
    path: str
    change: Change


Queued = Removal | Attributes


@dataclass(frozen=True, slots=True)
class Sent:
    """What the queue does with the store's answers."""

    remove: Remove
    set_attributes: SetAttributes
    kept: Callable[[str], Awaitable[None]]
    """A path the store did not remove: the daemon's view gets the name back."""
    changed: Callable[[str, FileInfo | None], Awaitable[None]]
    """A path whose attributes the store changed (its attributes) or did not (``None``)."""


class ChangeQueue:
    """The changes answered and not yet in the store."""

    def __init__(self, sent: Sent) -> None:
        self._sent = sent
        self._queued: list[Queued] = []
        self._gone: set[str] = set()
        """Paths whose removal is queued."""
        self._changing: Counter[str] = Counter()
        """Paths whose attribute changes are queued, and how many."""
        self._in: Counter[str] = Counter()
        """Directories with names pending removal, and how many."""
        self._dirs_waiting: Counter[str] = Counter()
        """Directories with directories queued for removal in them, not yet sent."""
        self._dirs_sending: Counter[str] = Counter()
        """Directories with directories whose removal is being sent."""
        self._base: dict[str, FileInfo] = {}
        """A directory's attributes as the store gave them while removals in it were
        pending (``seen_in``), its links less each directory removed in it since."""
        self._when: dict[str, int] = {}
        """When a name in each directory with removals pending last went (ns)."""
        self._task: asyncio.Task[None] | None = None
        self.groups = 0
        """Calls sent so far (for the tests and the metrics)."""

    def __contains__(self, path: str) -> bool:
        """Whether ``path`` was unlinked here and is not yet removed from the store."""
        return path in self._gone

    def changing(self, path: str) -> bool:
        """Whether ``path`` has attribute changes queued."""
        return self._changing[path] > 0

    def remove(self, path: str, tasks: Tasks, *, directory: bool = False) -> None:
        """Queue ``path``'s removal (its unlink, or rmdir, is answered now)."""
        self._gone.add(path)
        parent = posixpath.dirname(path)
        self._in[parent] += 1
        self._dirs_waiting[parent] += directory
        self._when[parent] = time.time_ns()
        self._add(Removal(path, directory), tasks)

    def set_attributes(self, path: str, change: Change, tasks: Tasks) -> None:
        """Queue ``change`` of ``path`` (its setattr is answered now)."""
        self._changing[path] += 1
        self._add(Attributes(path, change), tasks)

    def _add(self, item: Queued, tasks: Tasks) -> None:
        self._queued.append(item)
        if self._task is None:
            self._task = tasks.start(self._run())

    def removing_in(self, directory: str) -> tuple[int, int] | None:
        """``None`` if no removal in ``directory`` is pending; else how many directories
        in it are queued and how many being sent (``seen_in`` takes it back)."""
        if not self._in[directory]:
            return None
        return self._dirs_waiting[directory], self._dirs_sending[directory]

    def seen_in(self, directory: str) -> FileInfo | None:
        """The attributes of ``directory`` as its pending removals leave it, from the
        store's (``based``): a newer mtime and ctime, a link fewer for each directory
        queued or being sent. ``None`` if the store's are not known. (The kernel asks
        for a directory's attributes after each unlink in it: ``rm -rf`` waits on no
        group and asks the store once a directory.)"""
        base = self._base.get(directory)
        if base is None or not self._in[directory]:
            return None
        when = max(base.mtime_ns, self._when[directory])
        links = base.nlink - self._dirs_waiting[directory] - self._dirs_sending[directory]
        return msgspec.structs.replace(base, mtime_ns=when, ctime_ns=when, nlink=links)

    def based(self, directory: str, info: FileInfo, before: tuple[int, int]) -> FileInfo | None:
        """``seen_in``, from ``info``, which the store gave while ``removing_in`` said
        ``before``; ``None`` if that cannot be told (a directory in it was being sent,
        or was sent meanwhile: wait for the queue)."""
        if before[1] or self.removing_in(directory) != before:
            return None
        self._base[directory] = info
        return self.seen_in(directory)

    async def settled(self) -> None:
        """Wait until every change answered so far is in the store."""
        while self._task is not None:
            await asyncio.shield(self._task)

    async def _run(self) -> None:
        try:
            while self._queued:
                group, self._queued = self._queued, []
                for item in group:
                    if isinstance(item, Removal) and item.directory:
                        parent = posixpath.dirname(item.path)
                        self._dirs_waiting[parent] -= 1
                        self._dirs_sending[parent] += 1
                for run in _runs(group):
                    self.groups += 1
                    if isinstance(run[0], Removal):
                        await self._removed([r for r in run if isinstance(r, Removal)])
                    else:
                        await self._attributed([a for a in run if isinstance(a, Attributes)])
        finally:
            self._task = None

    async def _removed(self, group: list[Removal]) -> None:
        paths = [r.path for r in group]
        try:
            outcomes = await self._sent.remove(paths, [r.directory for r in group])
        except Exception as exc:  # each path learns it below
            outcomes = [exc] * len(group)
        for item, outcome in zip(group, outcomes, strict=True):
            self._gone.discard(item.path)
            parent = posixpath.dirname(item.path)
            self._in[parent] -= 1
            self._dirs_sending[parent] -= item.directory
            base = self._base.get(parent)
            if item.directory and outcome is None and base is not None:
                self._base[parent] = msgspec.structs.replace(base, nlink=base.nlink - 1)
            if not self._in[parent]:
                del self._in[parent], self._when[parent]
                self._base.pop(parent, None)
                self._dirs_waiting.pop(parent, None)
                self._dirs_sending.pop(parent, None)
            if outcome is not None and getattr(outcome, "errno", 0) != errno.ENOENT:
                log.warning("%s: unlinked, but the store kept it: %s", item.path, outcome)
                await self._sent.kept(item.path)

    async def _attributed(self, group: list[Attributes]) -> None:
        try:
            outcomes = await self._sent.set_attributes([(a.path, a.change) for a in group])
        except Exception as exc:  # each path learns it below
            outcomes = [exc] * len(group)
        for item, outcome in zip(group, outcomes, strict=True):
            self._changing[item.path] -= 1
            if not self._changing[item.path]:
                del self._changing[item.path]
            if isinstance(outcome, FileInfo):
                await self._sent.changed(item.path, outcome)
                continue
            if getattr(outcome, "errno", 0) != errno.ENOENT:
                log.warning("%s: its attributes were not changed: %s", item.path, outcome)
            await self._sent.changed(item.path, None)


def _runs(group: list[Queued]) -> list[list[Queued]]:
    """``group`` cut where the kind changes (each run goes in one call)."""
    runs: list[list[Queued]] = []
    for item in group:
        if runs and type(runs[-1][-1]) is type(item):
            runs[-1].append(item)
        else:
            runs.append([item])
    return runs


def changed(info: FileInfo, change: Change, now_ns: int) -> FileInfo:
    """``info`` with ``change`` applied at ``now_ns``, by the store's rule (``Change.applied``)."""
    return msgspec.structs.replace(info, **change.applied(info, now_ns))
