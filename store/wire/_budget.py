"""What a server holds for its peers: one budget of bytes shared by its connections."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from functools import partial


class MemoryBudget:
    """Bytes a server holds for what its peers send, shared by all its connections.

    A take that does not fit waits (the connection stops reading) until a give
    makes room; a lone take larger than the whole budget goes through when
    nothing else is held, so no legitimate request waits forever.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._waiting: deque[Callable[[], None]] = deque()

    def take(self, n: int, retry: Callable[[], None]) -> bool:
        """Hold ``n`` bytes; if they do not fit, ``retry`` is called once some are given back."""
        if self.used and self.used + n > self.limit:
            self._waiting.append(retry)
            return False
        self.used += n
        return True

    async def hold(self, n: int) -> None:
        """Take ``n`` bytes, waiting for room (for memory a handler allocates)."""
        while True:
            room: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            if self.take(n, partial(_settle, room)):
                return
            await room

    def give(self, n: int) -> None:
        """Return bytes taken; wakes the connections waiting for room."""
        self.used -= n
        waiting, self._waiting = self._waiting, deque()
        for retry in waiting:
            retry()


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
