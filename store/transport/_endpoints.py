"""The metadata services a client may use, the one it is using, and how it moves on.

A cluster URL names one endpoint or several (``graben://h1:7100,h2:7100``);
a name stands for every address it resolves to (its A and AAAA records),
each a service of its own. ``Endpoints`` resolves them on first use, and
again whenever every address has failed (the names may point elsewhere by
then), and keeps one address current. Every request goes to the current
address until it stops answering; then the next one in order becomes
current, with one log line naming both, and stays current until it fails in
turn. Not round robin: one client's requests go to one service, over one
warm connection, and a client that moved does not drift back to a service
that failed it.

A service "stops answering" when a connection to it cannot be made or is
lost, or when it keeps a call waiting and does not answer a ping either
(``watched``): a busy service answers pings on its event loop while its
engine works, a hung host or a cut link does not. ``Retry`` is one
request's bookkeeping: its deadline, its pauses, which addresses failed it
this round.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Sequence

import msgspec

from .._errors import GrabenError, Timeout, Unavailable
from ..wire import Connection

log = logging.getLogger("graben.client")
Resolver = Callable[[str, int], Awaitable[list[str]]]
"""(host, port) -> every ``address:port`` it stands for, in the resolver's order."""
PING_AFTER_S = 1.0
"""With another service to move to, a call this long without its reply pings the service."""
ANSWER_WITHIN_S = 2.0
"""With another service to move to, a service must accept a connection, or answer a
ping, within this long; else the client moves on."""


async def resolve_all(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to, as ``address:port`` (``loop.getaddrinfo``)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found = (info[4][0] for info in infos)
    return list(dict.fromkeys(f"{address}:{port}" for address in found if isinstance(address, str)))


class Endpoints:
    """The addresses of a cluster's metadata services; one of them current."""

    def __init__(self, given: Sequence[tuple[str, int]], *, resolve: Resolver = resolve_all):
        if not given:
            raise ValueError("a cluster needs at least one metadata service endpoint")
        self.given = tuple(given)
        """(host, port) as the URL named them, in order."""
        self._resolve = resolve
        self._addresses: list[str] = []
        self._at = 0
        self._answered = False  # the current address answered since it became current
        self._resolving: asyncio.Lock | None = None

    def __str__(self) -> str:
        return ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.given)

    @property
    def using(self) -> str:
        """The current address (before the first request: the endpoints as given)."""
        return self._addresses[self._at] if self._addresses else str(self)

    @property
    def several(self) -> bool:
        """Whether there is another address to move to (or may be, once resolved)."""
        return len(self._addresses) > 1 or (not self._addresses and len(self.given) > 1)

    async def current(self) -> str:
        """The address to send to; ``Unavailable`` if no name resolves."""
        if not self._addresses:
            await self.refresh()
        return self._addresses[self._at]

    def answered(self, address: str) -> None:
        """``address`` answered a request."""
        if self._addresses and self._addresses[self._at] == address:
            self._answered = True

    def move(self, failed: str, why: str) -> str:
        """The address to use now that ``failed`` stopped answering: the next one, if
        ``failed`` is still current (concurrent callers that saw it fail move once)."""
        if self._addresses and self._addresses[self._at] == failed:
            self._at = (self._at + 1) % len(self._addresses)
            now = self._addresses[self._at]
            if now != failed:
                # A warning when a working service is lost; while every one is down
                # (or at start, when the first address never answered) quieter.
                level = logging.WARNING if self._answered else logging.INFO
                log.log(
                    level,
                    "metadata service at %s stopped answering (%s); moving to %s",
                    failed,
                    why,
                    now,
                )
            self._answered = False
        return self._addresses[self._at] if self._addresses else failed

    async def refresh(self) -> None:
        """Resolve every name again; the current address stays current if still named."""
        if self._resolving is None:
            self._resolving = asyncio.Lock()
        async with self._resolving:
            found, errors = await self._lookup()
            if not found:
                raise Unavailable(
                    f"cannot resolve the metadata service's address {self}: {'; '.join(errors)}"
                )
            keep = self._addresses[self._at] if self._addresses else None
            self._addresses = found
            self._at = found.index(keep) if keep in found else 0

    async def _lookup(self) -> tuple[list[str], list[str]]:
        found: dict[str, None] = {}
        errors: list[str] = []
        for host, port in self.given:
            try:
                found.update(dict.fromkeys(await self._resolve(host, port)))
            except OSError as exc:  # socket.gaierror: no such name, or no resolver answer
                errors.append(f"{host}: {exc.strerror or exc}")
        return list(found), errors


class Retry:
    """One request's retries: its deadline, its pauses, the endpoints it tried this round."""

    def __init__(self, limit: float) -> None:
        self.start = time.monotonic()
        self.deadline = self.start + limit
        self.limit = limit
        self.delay, self.tries, self.warned = 0.05, 0, False
        self.tried: set[str] = set()
        self.answered = False
        """The last failure was the service's own answer (``Unavailable``: its engine is away)."""

    def left(self) -> float:
        return self.deadline - time.monotonic()

    async def pause(self) -> None:
        await asyncio.sleep(max(min(self.delay, self.left()), 0.0))
        self.delay = min(self.delay * 2, 1.0)
        self.tried.clear()


async def watched(
    conn: Connection, body: msgspec.Raw, token: str, wait: float, *, ping: bool
) -> msgspec.Raw:
    """A ``meta`` call's reply; with ``ping``, a service that keeps the caller waiting
    must answer a ping now and then, else ``Timeout`` (and the connection is closed, so
    every call waiting on it moves on, not only this one)."""
    call = asyncio.ensure_future(conn.call("meta", body, token=token, timeout=wait))
    try:
        while ping and not call.done():
            await asyncio.wait({call}, timeout=PING_AFTER_S)
            if not call.done() and not await _alive(conn, token):
                await conn.close()
                with contextlib.suppress(GrabenError):
                    await call
                raise Timeout(
                    f"the metadata service at {conn.where} kept a call waiting and did not "
                    f"answer a ping within {ANSWER_WITHIN_S:g} s"
                )
        reply, _ = await call
        return reply
    finally:
        call.cancel()  # nothing if it is done


async def _alive(conn: Connection, token: str) -> bool:
    try:
        await conn.call("ping", token=token, timeout=ANSWER_WITHIN_S)
    except (Unavailable, Timeout):
        return False
    except GrabenError:
        pass  # an answer all the same (an older service knows no ping)
    return True
