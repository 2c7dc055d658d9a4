"""Batching of concurrent calls: group commit, and its cousins.

A ``Batcher`` queues items from many callers and hands them on in groups. At
most ``concurrency`` groups are in flight; items that arrive meanwhile wait
and go together in the next group. Idle, an item goes at once (no timer, no
added latency); busy, N items share one round trip, one transaction or one
fsync. Used for the metadata service's group commit, a client's merged
placement and commit requests, and a data node's grouped syncs.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

K = TypeVar("K")
T = TypeVar("T")
R = TypeVar("R")
MAX_GROUP = 4096
"""Most units (see ``Batcher.size``) in one group, so one group's latency stays bounded."""


class Batcher(Generic[T, R]):
    """Hands items to ``run`` in groups; ``run`` returns each item's result or error, in order."""

    def __init__(
        self,
        run: Callable[[list[T]], Awaitable[Sequence[R | Exception]]],
        *,
        size: Callable[[T], int] = lambda item: 1,
        max_size: int = MAX_GROUP,
        concurrency: int = 1,
    ) -> None:
        self._run, self._size, self._max = run, size, max_size
        self._concurrency = concurrency
        self._queue: deque[tuple[T, asyncio.Future[R]]] = deque()
        self._drainers: set[asyncio.Task[None]] = set()  # referenced while they run
        self._running = 0  # counted here, not by the set: a task leaves it a tick late

    async def submit(self, item: T) -> R:
        """``item``'s result, once the group it joined has run."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.append((item, future))
        if self._running < self._concurrency:
            self._running += 1
            task = asyncio.ensure_future(self._drain())
            self._drainers.add(task)
            task.add_done_callback(self._drainers.discard)
        return await future

    async def _drain(self) -> None:
        try:
            await self._drain_queue()
        finally:
            self._running -= 1  # no await between the empty queue and this

    async def _drain_queue(self) -> None:
        while self._queue:
            group = self._take()
            if group:
                await self._run_group(group)

    async def _run_group(self, group: list[tuple[T, asyncio.Future[R]]]) -> None:
        """Run one group and hand each caller its result.

        A frame of its own: the group's items (callers' buffers, say) must not
        stay referenced while the next group runs, past their callers' return.
        """
        try:
            results = await self._run([item for item, _ in group])
        except Exception as exc:  # the whole group failed: so did each item
            results = [exc] * len(group)
        except BaseException:  # cancelled: so are the callers' waits
            for _, future in group:
                future.cancel()
            raise
        for (_, future), result in zip(group, results, strict=True):
            if future.done():  # its caller gave up waiting
                continue
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)

    def _take(self) -> list[tuple[T, asyncio.Future[R]]]:
        group: list[tuple[T, asyncio.Future[R]]] = []
        units = 0
        while self._queue:
            item, future = self._queue[0]
            if future.done():  # its caller gave up: the item (a buffer, say) is not ours now
                self._queue.popleft()
                continue
            size = self._size(item)
            if group and units + size > self._max:
                break
            group.append(self._queue.popleft())
            units += size
        return group


class Batchers(Generic[K, T, R]):
    """One ``Batcher`` per key (a node, a replication factor), made on first use."""

    def __init__(self, make: Callable[[K], Batcher[T, R]]) -> None:
        self._make = make
        self._by_key: dict[K, Batcher[T, R]] = {}

    def __getitem__(self, key: K) -> Batcher[T, R]:
        batcher = self._by_key.get(key)
        if batcher is None:
            batcher = self._by_key[key] = self._make(key)
        return batcher
