"""Calls handed to worker threads that let go of their arguments when they return.

``loop.run_in_executor(pool, fn, *args)`` keeps ``args`` in the executor's
work item until the worker thread gets past it, which can be after the
awaiting coroutine has resumed, and after its caller has returned. A caller's
buffer given as an argument (a slice of a mapped file, say) is then still
exported when the caller closes it: ``BufferError``. ``in_thread`` runs the
same call, but its arguments are dropped in the worker before the result is
handed back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor
from functools import partial
from typing import Any, Generic, TypeVar

R = TypeVar("R")


class _Once(Generic[R]):
    """A call that forgets its function and arguments as it runs."""

    def __init__(self, call: Callable[[], R]) -> None:
        self._call: Callable[[], R] | None = call

    def __call__(self) -> R:
        call, self._call = self._call, None
        assert call is not None, "a call runs once"
        return call()


async def in_thread(executor: Executor | None, fn: Callable[..., R], *args: Any) -> R:
    """``fn(*args)`` on ``executor``; nothing of ``args`` is held once it returns."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(executor, _Once(partial(fn, *args)))
