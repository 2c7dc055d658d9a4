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
import select
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


class Readable:
    """pyfuse3's wait for the FUSE device to be readable, with the device left in the
    loop's selector between requests.

    ``pyfuse3.asyncio`` adds the device to the selector for each request and takes it
    out again (two ``epoll_ctl`` calls and a selector update a request: a fifth of the
    loop's busy time under ``git status``). Here it stays in while a reader keeps coming
    back for it; a wake with nobody waiting twice in a row (every pyfuse3 task busy)
    takes it out until one waits again, so the loop does not spin on a readable device.
    pyfuse3 lets one task at a time wait (its read lock), and reads as soon as it wakes:
    a wake is given only for a device that is readable then.
    """

    def __init__(self, closed: type[Exception]) -> None:
        self._closed = closed  # what pyfuse3 catches as "the device is closing"
        self._waiters: dict[int, list[asyncio.Future[None]]] = {}
        self._idle: dict[int, int] = {}  # fd -> wakes in a row with nobody waiting

    async def wait_readable(self, fd: int) -> None:
        """Until ``fd`` is readable (or closing: ``closed`` is raised)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        waiters = self._waiters.get(fd)
        if waiters is None:
            waiters = self._waiters[fd] = []
            self._idle[fd] = 0
            loop.add_reader(fd, self._ready, fd)
        waiters.append(future)
        try:
            await future
        finally:
            if future in waiters:
                waiters.remove(future)

    def notify_closing(self, fd: int) -> None:
        """``fd`` is about to be closed: every waiter is told, the selector lets it go."""
        waiters = self._waiters.pop(fd, [])
        self._idle.pop(fd, None)
        asyncio.get_running_loop().remove_reader(fd)
        for future in waiters:
            if not future.done():
                future.set_exception(self._closed())

    def close(self) -> None:
        """Out of the selector: the FUSE loop has ended."""
        for fd in list(self._waiters):
            self.notify_closing(fd)

    def _ready(self, fd: int) -> None:
        waiters = self._waiters[fd]
        if waiters and not select.select((fd,), (), (), 0)[0]:
            # The selector's word is from before this turn of the loop: the request it
            # saw may have been read since, and a reader woken to an empty device would
            # block the loop in its read.
            return
        while waiters:
            future = waiters.pop(0)
            if not future.done():
                self._idle[fd] = 0
                future.set_result(None)
                return
        self._idle[fd] += 1
        if self._idle[fd] >= 2:
            del self._waiters[fd], self._idle[fd]
            asyncio.get_running_loop().remove_reader(fd)
