"""Servers' periodic tasks (heartbeats, repair rounds, idle sweeps): ``every`` starts
one, ``stop`` ends them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from .._errors import GrabenError

log = logging.getLogger("graben.rpc")


def every(
    seconds: float, work: Callable[[], Awaitable[object]], what: str, *, at_once: bool = False
) -> asyncio.Task[None]:
    """Run ``work`` every ``seconds`` until the task is cancelled.

    A failure is logged and the next round runs anyway: a server's heartbeat
    or repair loop must never die of one bad round.
    """

    async def loop() -> None:
        if not at_once:
            await asyncio.sleep(seconds)
        while True:
            try:
                await work()
            except GrabenError as exc:  # expected now and then (a peer is away): one line
                log.warning("%s failed: %s; trying again in %s s", what, exc, seconds)
            except Exception:  # a bug: the traceback, but the loop lives on
                log.exception("%s failed; trying again in %s s", what, seconds)
            await asyncio.sleep(seconds)

    return asyncio.ensure_future(loop())


async def stop(*tasks: asyncio.Task[None] | None) -> None:
    """Cancel background tasks and wait until they are gone."""
    live = [t for t in tasks if t is not None]
    for task in live:
        task.cancel()
    await asyncio.gather(*live, return_exceptions=True)
