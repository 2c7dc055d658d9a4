"""The mount follows the store's change feed, so the kernel may cache for long.

The kernel keeps names and attributes for ``MountOptions.timeout`` seconds
(30 by default) without asking the daemon. What makes that safe is this: the
daemon asks the store every ``FOLLOW_S`` for the paths others changed since
it last asked (``Changes``, ``store/meta/_changes.py``), and tells the kernel
to forget what it holds of each (``invalidate_inode``, ``invalidate_entry``),
so a change made through the API or another mount shows here within about
``FOLLOW_S`` plus a round trip. A change whose store inode and ctime are what
the mount last told the kernel (its own writes, and what it has looked up
since) costs nothing. A mount that was away longer than the feed keeps its
rows (``KEPT_S``) makes the kernel forget everything it holds.

``Cursor`` is the pure part: where the mount is in the feed, which numbers it
has not seen yet below that (``missing``: on PostgreSQL a transaction that
took its number first may commit later), and when it fell behind.
"""

from __future__ import annotations

import asyncio
import logging
import os
import posixpath
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field

import pyfuse3

from graben.store import ChangeFeed, FileInfo, GrabenError, PathChange

from ._aio import in_thread
from ._inodes import ROOT, InodeTable
from ._names import WholeDirs

log = logging.getLogger("graben.fuse")
FOLLOW_S = 0.2
"""How often the mount asks for changes."""
MISSING_S = 30.0
"""How long a number not seen below the last one is asked for again: longer than any
transaction lasts (PostgreSQL ends one idle for 5 s)."""
MISSING_MAX = 1000
"""Most numbers asked for again at once (the oldest go first)."""
PAGE = 1000


@dataclass
class Cursor:
    """Where a reader is in the change feed."""

    after: int = -1
    """The last number seen (-1: none yet; the first answer says where the feed is)."""
    missing: dict[int, float] = field(default_factory=dict)
    """Numbers below ``after`` not seen yet, with when each was first missed."""

    def request(self, now: float) -> tuple[int, tuple[int, ...]]:
        """What to ask for: the changes after the last seen, and the missing ones."""
        for seq in [s for s, since in self.missing.items() if now - since > MISSING_S]:
            del self.missing[seq]  # rolled back: it never will be seen
        while len(self.missing) > MISSING_MAX:
            del self.missing[min(self.missing)]
        return self.after, tuple(sorted(self.missing))

    def advance(self, feed: ChangeFeed, now: float) -> tuple[list[PathChange], bool]:
        """The changes of ``feed`` not seen before, and whether some were missed (the
        reader was behind the oldest row kept)."""
        if self.after < 0:
            self.after = feed.newest
            return [], False
        lost = feed.oldest > self.after + 1 and self.after > 0
        fresh = []
        for change in feed.changes:
            if change.seq > self.after:
                for gap in range(self.after + 1, change.seq):
                    self.missing.setdefault(gap, now)
                self.after = change.seq
            elif change.seq not in self.missing:
                continue  # seen already
            self.missing.pop(change.seq, None)
            fresh.append(change)
        if lost:
            self.missing.clear()
        return fresh, lost


Known = dict[int, FileInfo]
"""What the mount last told the kernel of each of its inodes (``FileInfo.inode`` and
``ctime_ns`` say which version of the path that was)."""
Ask = Callable[[int, tuple[int, ...]], Awaitable[ChangeFeed]]
"""The store's change feed after a number, with the missing numbers (``AsyncClient.changes``)."""
Current = Callable[[str], Awaitable[tuple[int, int]]]
"""The store inode and ctime at a path now ((0, 0): nothing there)."""
Weighing = Callable[[], AbstractAsyncContextManager[None]]
"""While the feed is weighed, no change of the mount's own is under way (``Base.weighing``)."""


async def follow(
    ask: Ask,
    current: Current,
    inodes: InodeTable,
    known: Known,
    whole: WholeDirs,
    weighing: Weighing,
    every: float = FOLLOW_S,
    exact: set[int] | None = None,
) -> None:
    """Ask for changes every ``every`` seconds, for ever; drop what the kernel and the
    daemon hold of each path another client changed. A page is weighed with none of the
    mount's own changes under way (``weighing``): its own rename, committed and in the
    feed but not yet noted, would look like another client's."""
    cursor, failing = Cursor(), False
    exact = set() if exact is None else exact  # directories whose attributes are known
    while True:
        more = False
        try:
            feed = await ask(*cursor.request(time.monotonic()))
            changes, lost = cursor.advance(feed, time.monotonic())
            if lost:
                log.warning("changes were missed (away too long): the kernel forgets all")
                whole.clear()
                exact.clear()
                await in_thread(_forget_all, inodes)
            elif changes:
                async with weighing():
                    work, names = await _invalidations(changes, current, inodes, known, whole)
                exact.difference_update(inode for inode, _ in work)  # known, but old
                if work or names:
                    await in_thread(_invalidate, work, names, inodes, known)
            more = len(feed.changes) >= PAGE
        except (GrabenError, OSError) as exc:
            if not failing:
                log.warning("cannot follow the store's changes (%s); trying again", exc)
                whole.clear()  # what changed meanwhile cannot be told
                exact.clear()
            failing = True
        else:
            if failing:
                log.info("following the store's changes again")
            failing = False
        if not more:
            await asyncio.sleep(every)


Invalidation = tuple[int, bytes | None]
"""An inode whose attributes and pages the kernel drops; with a name, the directory
entry of that name in it is dropped instead."""
NameDrop = tuple[int, bytes, int | None, FileInfo | None]
"""A directory entry to drop: (its directory's inode, its name), with what the daemon
held of the name when the feed was weighed (its inode, and what it knew of that)."""


async def _invalidations(
    changes: Sequence[PathChange],
    current: Current,
    inodes: InodeTable,
    known: Known,
    whole: WholeDirs,
) -> tuple[list[Invalidation], list[NameDrop]]:
    """What the kernel must forget for ``changes``: nothing where it holds what the path
    is now (the mount's own writes, a path changed again since, one looked up since);
    apart, the directory entries to drop, checked again just before (``still_due``)."""
    last = {change.path: (change.inode, change.ctime_ns) for change in changes}
    work: list[Invalidation] = []
    names: list[NameDrop] = []
    for path, now in last.items():
        inode = inodes.peek(path)
        parent_path, name = posixpath.split(path)
        parent = inodes.peek(parent_path)
        if inode is None:  # the kernel holds no inode of this path from us
            whole.elsewhere(path, there=now[0] != 0)
            if parent is not None:
                # Made, and there now (not this mount's own name renamed away again):
                # a negative entry the kernel kept goes.
                if now[0] and (await current(path))[0]:
                    names.append((parent, os.fsencode(name), None, None))
                work.append((parent, None))  # and its directory's mtime and links moved
            continue
        was = known.get(inode)
        kernel_saw = None if was is None else (was.inode, was.ctime_ns)
        if kernel_saw == now or kernel_saw == (now := await current(path)):
            continue
        whole.elsewhere(path, there=now[0] != 0)
        known.pop(inode, None)
        work.append((inode, None))
        if parent is not None:
            if kernel_saw is None or kernel_saw[0] != now[0]:
                names.append((parent, os.fsencode(name), inode, None))  # gone, or another
            work.append((parent, None))
    return work, names


def still_due(drop: NameDrop, inodes: InodeTable, known: Known) -> bool:
    """Whether a directory entry weighed for dropping is still to drop: not if the daemon
    has learned the name anew since, the mount itself having made it, renamed it back or
    looked it up (the kernel's entry is the store's; dropping it would make the kernel
    forget the inode, and its number change: pjdfstest's rename tests, back and forth,
    which under load ran into the gap between weighing and telling the kernel)."""
    parent, name, inode, knew = drop
    if parent not in inodes:
        return True
    now = inodes.peek(inodes.child(inodes.path(parent), os.fsdecode(name)))
    return now == inode and (now is None or known.get(now) is knew)


def _invalidate(
    work: Sequence[Invalidation],
    names: Sequence[NameDrop] = (),
    inodes: InodeTable | None = None,
    known: Known | None = None,
) -> None:
    """Tell the kernel (a worker thread: a call waits for related requests to end); each
    entry in ``names`` checked just before (``still_due``: the loop goes on meanwhile)."""
    for inode, name in work:
        _tell(inode, name)
    for drop in names:
        if inodes is None or known is None or still_due(drop, inodes, known):
            _tell(drop[0], drop[1])


def _tell(inode: int, name: bytes | None) -> None:
    try:
        if name is None:
            pyfuse3.invalidate_inode(inode)
        else:
            pyfuse3.invalidate_entry(inode, name)
    except OSError as exc:  # the kernel forgot it meanwhile
        log.debug("could not invalidate inode %d %r: %s", inode, name, exc)


def _forget_all(inodes: InodeTable) -> None:
    work: list[Invalidation] = []
    for path, inode in inodes.known():
        if inode == ROOT:
            continue
        parent = inodes.peek(posixpath.dirname(path))
        work.append((inode, None))
        if parent is not None:
            work.append((parent, os.fsencode(posixpath.basename(path))))
    _invalidate(work)
