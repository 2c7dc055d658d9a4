"""The daemon's one asyncio loop: blocking work in worker threads, background tasks.

pyfuse3 runs on asyncio here (``pyfuse3.asyncio``), the loop the store client's
calls are awaited on. Work that blocks (a file's bytes through a spool, the
kernel's invalidations) goes to ``in_thread``: a pool of its own, whose calls
are waited for even when the awaiting handler is cancelled (the thread may
still hold the handler's buffers), as trio's threads were. ``Tasks`` keeps
the background tasks a handler starts (read-ahead, uploads) and cancels them
when the mount ends.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

R = TypeVar("R")
WORKERS = 40
"""Worker threads at most (trio's default limit, which the daemon was tuned with)."""
_pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="graben-fuse")


async def in_thread(fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
    """``fn(*args, **kwargs)`` in a worker thread; a cancelled caller waits for it to end."""
    future = asyncio.get_running_loop().run_in_executor(
        _pool, functools.partial(fn, *args, **kwargs)
    )
    return await settled(future)


async def settled(future: asyncio.Future[R]) -> R:
    """``future``'s result; a cancelled caller waits for it to end first (the work may
    still hold its buffers), then is cancelled."""
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        if not future.done():
            await asyncio.wait([future])
        raise


class Tasks:
    """Background tasks of the mount, cancelled together when it ends."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def start_soon(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        """Run ``fn(*args)`` in the background (an error is logged by asyncio)."""
        self.start(fn(*args))

    def start(self, coro: Coroutine[Any, Any, R]) -> asyncio.Task[R]:
        """Run ``coro`` in the background; its task, to wait for."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def cancel_all(self) -> None:
        """Cancel every task still running and wait for them."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks))
