"""One leader among the metadata services of an engine: a lease with a fencing number.

Any number of metadata services may serve one engine, but the background
duties (repair rounds: deleting copies reported damaged, copying short
chunks to new nodes) must run on one of them at a time, or two services
would copy the same chunk twice and undo each other's bookkeeping.

The lease is one row in the engine: its holder (a service id), a fencing
number and an expiry by the engine's clock. Every ``BEAT_S`` each service
records itself in ``services`` and, in the same write transaction, renews
the lease if it holds it or takes it if it has expired; taking it from
another holder (or from nobody) adds one to the fence. A service that stops
cleanly gives the lease up, so the next one takes it at its next beat.

A holder counts itself leader until ``lease_s`` less a tenth after it
*sent* its last renewal, by its own monotonic clock: the engine set the
expiry from a later instant, so the holder stops before anyone else could
take over, even when the engine answered slowly. A timer fires at that
moment and ends its leadership at once, whatever the duties are doing.

A leader stopped past its lease (SIGSTOP, a long pause, a partition) may
wake up in the middle of a round. So every write a duty makes to the
engine runs in a transaction that first reads the lease and goes on only
if the fence is still the one the duty started under (``fenced_write``);
otherwise nothing is written and the duty gets ``Deposed``. The lease is
read locked (SQLite's one writer, PostgreSQL's row lock until the commit),
so no other leader can take over between the check and the commit. Copies
written to or deleted from data nodes cannot be fenced by the engine: the
leader checks its lease before each one (``Leadership.check``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress

import msgspec

from .._errors import GrabenError, PermissionDenied
from .._types import ServiceState
from ..wire import Metrics
from ._repo import Lease, R, Repository, Tx

log = logging.getLogger("graben.meta")

LEASE_S = 5.0
"""How long a lease lasts past its last renewal, by the engine's clock."""
BEAT_S = 1.0
"""Seconds between a service's heartbeats (each one renews the lease of a leader)."""
PRUNE_S = 600.0
"""A service not heard from for this long is forgotten."""


class Deposed(PermissionDenied):
    """This service no longer holds the lease: a duty's write was refused, nothing written."""


class SchemaChanged(GrabenError):
    """The engine's schema is no longer the one this service was written for: a newer
    graben migrated it (one that did not see this service beat), so this one stops."""


def claim(tx: Tx, holder: str, now: float, lease_s: float) -> Lease:
    """Renew ``holder``'s lease, or take it if it has expired; the lease as it stands after."""
    held = tx.services.lease()
    if held.holder != holder and held.expires > now:
        return held
    # Its own lease renewed keeps its fence even after lapsing: nobody else held it between.
    fence = held.fence if held.holder == holder else held.fence + 1
    taken = Lease(holder, fence, now + lease_s)
    tx.services.set_lease(taken)
    return taken


def beat(repo: Repository, me: ServiceState, lease_s: float) -> Lease:
    """Record the service as alive and claim the lease, in one write transaction."""

    def record(tx: Tx) -> Lease:
        found = tx.services.schema_version()
        if found != me.schema_version:
            raise SchemaChanged(
                f"the engine's schema is now version {found}, not the {me.schema_version} "
                f"metadata service {me.id} at {me.address} was written for: another graben "
                "has migrated it; this service stops (upgrade it, then start it again)"
            )
        now = tx.services.now()
        tx.services.upsert_service(msgspec.structs.replace(me, started=now, last_seen=now))
        tx.services.forget_services(seen_before=now - PRUNE_S)
        return claim(tx, me.id, now, lease_s)

    return repo.transact(record)


def resign(repo: Repository, holder: str) -> None:
    """A service stopping cleanly: give the lease up (if held) and leave the registry."""

    def leave(tx: Tx) -> None:
        held = tx.services.lease()
        if held.holder == holder:
            tx.services.set_lease(Lease(holder, held.fence, 0.0))
        tx.services.forget_services(ids=(holder,))

    repo.transact(leave)


def fenced_write(repo: Repository, fence: int | None, what: str, work: Callable[[Tx], R]) -> R:
    """``repo.transact(work)``, refused with ``Deposed`` (nothing written) unless the
    lease's fence is still ``fence``; ``None``: not a duty's write, never refused."""

    def run(tx: Tx) -> R:
        if fence is not None:
            held = tx.services.lease()  # locked till the commit: nobody takes the lease meanwhile
            if held.fence != fence:
                raise Deposed(
                    f"{what} refused: this service led under fence {fence}, but service "
                    f"{held.holder} has taken the lease since (fence {held.fence})"
                )
        return work(tx)

    return repo.transact(run)


class _Gauges:
    def __init__(self, metrics: Metrics) -> None:
        self.leader = metrics.gauge(
            "graben_meta_leader", "1 while this metadata service holds the lease and runs repair"
        )
        self.fence = metrics.gauge(
            "graben_meta_fence", "The lease's fencing number as this service last saw it"
        )


class Leadership:
    """A service's side of the lease: renewed by ``beat`` (call it every ``BEAT_S``),
    lost when it lapses; ``check`` before each duty's step."""

    def __init__(
        self,
        repo: Repository,
        me: ServiceState,
        *,
        lease_s: float = LEASE_S,
        metrics: Metrics | None = None,
    ) -> None:
        self.repo, self.me, self.lease_s = repo, me, lease_s
        # A thread of its own: the service's engine threads may all be busy with clients.
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="graben-lease")
        self._held: tuple[int, float] | None = None
        """(fence, monotonic deadline) while leading."""
        self._watchdog: asyncio.TimerHandle | None = None
        self._failing = False
        self._gauges = None if metrics is None else _Gauges(metrics)
        self.outdated: SchemaChanged | None = None
        """Why the service must stop, once a beat found the schema changed under it."""
        self._outdated = asyncio.Event()

    @property
    def leading(self) -> bool:
        """Whether this service holds the lease now."""
        return self._held is not None and time.monotonic() < self._held[1]

    def check(self) -> int:
        """The fence this service leads under; ``Deposed`` if it does not lead now."""
        if self._held is None or time.monotonic() >= self._held[1]:
            raise Deposed(f"metadata service {self.me.id} does not hold the lease")
        return self._held[0]

    async def beat(self) -> None:
        """Heartbeat and renew (or take) the lease; a failure ends leadership only when the
        lease lapses (the watchdog)."""
        if self.outdated is not None:
            return
        sent = time.monotonic()
        loop = asyncio.get_running_loop()
        try:
            lease = await loop.run_in_executor(self._thread, beat, self.repo, self.me, self.lease_s)
        except SchemaChanged as exc:
            log.error("%s", exc.message)
            self.lose("the engine's schema changed under it")
            self.outdated = exc
            self._outdated.set()
            return
        except GrabenError as exc:
            if not self._failing:  # one line per outage, not one a second
                log.warning("metadata service %s cannot reach the engine: %s", self.me.id, exc)
            self._failing = True
            return
        if self._failing:
            log.info("metadata service %s reaches the engine again", self.me.id)
        self._failing = False
        if self._gauges is not None:
            self._gauges.fence.set(lease.fence)
        if lease.holder != self.me.id:
            self.lose(f"service {lease.holder} holds the lease (fence {lease.fence})")
            return
        self._hold(lease.fence, sent + self.lease_s * 0.9)

    async def until_outdated(self) -> SchemaChanged:
        """Wait until a beat finds the schema changed under this service; why it must stop."""
        await self._outdated.wait()
        assert self.outdated is not None
        return self.outdated

    def _hold(self, fence: int, deadline: float) -> None:
        now = time.monotonic()
        if now >= deadline:
            return  # renewed too slowly to count on: the watchdog has it
        if self._held is None or self._held[0] != fence:
            log.info("metadata service %s leads (fence %d)", self.me.id, fence)
        self._held = (fence, deadline)
        if self._gauges is not None:
            self._gauges.leader.set(1)
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._watchdog = asyncio.get_running_loop().call_later(deadline - now, self._lapse)

    def _lapse(self) -> None:
        if self._held is not None and time.monotonic() >= self._held[1]:
            self.lose("its lease was not renewed in time")

    def lose(self, why: str) -> None:
        """Stop leading, at once (the duties' next ``check`` refuses)."""
        if self._held is None:
            return
        log.warning(
            "metadata service %s stops leading (fence %d): %s", self.me.id, self._held[0], why
        )
        self._held = None
        if self._gauges is not None:
            self._gauges.leader.set(0)

    async def close(self) -> None:
        """Give the lease up for the next service, and leave the registry."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._held = None
        loop = asyncio.get_running_loop()
        with suppress(GrabenError):  # an engine that is down: the lease lapses by itself
            await loop.run_in_executor(self._thread, resign, self.repo, self.me.id)
        self._thread.shutdown(wait=True)
