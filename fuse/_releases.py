"""Releases under way: a file closed just now is committed before anyone asks about it.

The kernel sends RELEASE (the last close of an open file) without waiting
for the answer, but queues it before ``close`` returns; and pyfuse3 runs
each request's handler up to its first ``await`` before it reads the next
request. So a release that registers here before its first ``await`` is
registered before any request that follows the close is handled, and that
request, waiting here, sees the file committed (close-to-open).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator


class Releases:
    """The releases under way, by inode."""

    def __init__(self) -> None:
        self._running: dict[int, list[asyncio.Event]] = {}

    @contextlib.contextmanager
    def running(self, inode: int) -> Iterator[None]:
        """Register a release of ``inode`` for the block (enter it before any ``await``)."""
        done = asyncio.Event()
        self._running.setdefault(inode, []).append(done)
        try:
            yield
        finally:
            done.set()
            running = self._running[inode]
            running.remove(done)
            if not running:
                del self._running[inode]

    async def settled(self, inode: int | None) -> None:
        """Wait for the releases of ``inode`` under way now (``None``: no inode, no wait)."""
        for done in list(self._running.get(inode, ())) if inode is not None else ():
            await done.wait()

    async def all_settled(self) -> None:
        """Wait for every release under way now (a rename or listing may involve any file)."""
        for running in list(self._running.values()):
            for done in list(running):
                await done.wait()
