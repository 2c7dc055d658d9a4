"""Nodes that fell behind: a write goes on without them, reads ask them last.

A read of a chunk from a node that does not answer within the deadline asks
the next copy (the last copy is waited for as long as the call allows: a busy
cluster must not fail a read).

A hung data node (a stopped process, a dying disk, a half-dead host) answers
nothing and refuses nothing. A replicated write waits for every copy, so one
such node would hold every writer for the whole call timeout. Instead, once
one copy of a chunk is written the others get ``deadline`` seconds more; a
node past it is given up for that chunk (the write goes on degraded, the
commit records the copies it has and repair adds the rest) and noted slow for
``SLOW_FOR_S``, so later writes place around it at once and reads ask it last.
The deadline starts from a peer's answer, not the call's start, so a cluster
that is merely busy (every node slow alike) never counts as a straggler.

A chunk with no other copy (one copy asked, or every copy on hung nodes) has
no peer to start a deadline: its first contact with a hung node waits for the
connection (the kernel accepts it, nobody answers) at most the client's
``timeout``. That wait is paid once per client, not once per chunk: a node
that times out or is unreachable is noted slow too, every other call still
waiting on it gives up at once (``each``), and later chunks are placed around
it (``avoid``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterable

from .._errors import Timeout, Unavailable

READ_FLOOR_BPS = 25e6
"""The slowest rate a read of a chunk is allowed on top of the deadline before the next
copy is asked instead (8 MiB: 0.34 s more)."""
SLOW_FOR_S = 15.0
"""How long a node that missed a deadline is passed over: past the metadata
service's heartbeat timeout (10 s), by when it no longer places chunks on a
node that stopped answering."""


class SlowNodes:
    """The nodes one client saw fall behind, and the deadline that says so."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self._until: dict[str, float] = {}
        self._noted: dict[str, asyncio.Event] = {}
        """Set when a node is noted slow: the calls waiting on it give up (``_unless_noted``)."""

    def note(self, node: str) -> None:
        self._until[node] = time.monotonic() + SLOW_FOR_S
        noted = self._noted.pop(node, None)
        if noted is not None:
            noted.set()

    def avoid(self) -> tuple[str, ...]:
        """The nodes slow now, for a placement to go around."""
        now = time.monotonic()
        return tuple(node for node, until in self._until.items() if until > now)

    def slow(self, node: str) -> bool:
        """Whether ``node`` missed a deadline in the last ``SLOW_FOR_S`` (any thread may ask)."""
        return self._until.get(node, 0.0) > time.monotonic()

    async def bounded(self, node: str, read: Awaitable[None], nbytes: int) -> None:
        """``read`` (of ``nbytes`` from ``node``), given ``deadline`` seconds and a slow
        transfer's time: past them it is cancelled, the node noted slow, and ``Timeout``
        raised (the reader asks another copy). Only for a copy that is not the last."""
        try:
            await asyncio.wait_for(read, self.deadline + nbytes / READ_FLOOR_BPS)
        except TimeoutError:
            self.note(node)
            raise Timeout(
                f"data node {node} did not answer a read within {self.deadline:g} s"
            ) from None

    def order(self, nodes: Iterable[str]) -> list[str]:
        """``nodes`` with the slow ones last (a stable sort: the rest keep their order)."""
        return sorted(nodes, key=self.slow)

    async def each(self, calls: dict[str, Awaitable[None]]) -> dict[str, BaseException | None]:
        """Run one call per node; each node's error, or ``None``.

        Once a call succeeds, the rest have ``deadline`` seconds to; those still
        running then are cancelled, noted slow and fail with ``Timeout``. A call that
        times out or finds its node unreachable notes the node slow as well, and a call
        to a node noted slow meanwhile (by any call of this client) gives up at once.
        """
        tasks = {
            asyncio.ensure_future(self._unless_noted(node, call)): node
            for node, call in calls.items()
        }
        results: dict[str, BaseException | None] = {}
        pending = set(tasks)
        cutoff: float | None = None
        try:
            while pending:
                left = None if cutoff is None else max(0.0, cutoff - time.monotonic())
                done, pending = await asyncio.wait(
                    pending, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    break  # past the deadline
                for task in done:
                    results[tasks[task]] = error = task.exception()
                    if isinstance(error, (Timeout, Unavailable)):
                        self.note(tasks[task])
                if cutoff is None and any(results[tasks[t]] is None for t in done):
                    cutoff = time.monotonic() + self.deadline
        finally:
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        for task in pending:
            node = tasks[task]
            self.note(node)
            results[node] = Timeout(
                f"data node {node} wrote nothing within {self.deadline:g} s of another copy"
            )
        return results

    async def _unless_noted(self, node: str, call: Awaitable[None]) -> None:
        """``call``, given up (``Timeout``) as soon as ``node`` is noted slow: the chunks
        queued behind a hung node's first contact must not each wait for one of their own."""
        noted = self._noted.setdefault(node, asyncio.Event())
        task, noted_slow = asyncio.ensure_future(call), asyncio.ensure_future(noted.wait())
        try:
            await asyncio.wait((task, noted_slow), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in (task, noted_slow):
                waiting.cancel()
            await asyncio.gather(task, noted_slow, return_exceptions=True)
        if task.cancelled():
            raise Timeout(f"data node {node} fell behind another call of this client: passed over")
        task.result()  # its error, if it failed
