"""``AgentClient``: a rank's (and ``graben``'s) calls to its node's memory agent.

Call order for a save: ``reserve`` (a file of the segment's size, in shared
memory), write it, ``done`` naming the ranges a reader will read (the agent
hashes them); once the store holds the step, ``stored``. For a load:
``steps`` (what this rank could read back), then ``locate`` (the file and each
range's blake3, fetched from a peer agent first if only a peer holds it), read
it and check what is read against them.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from .._config import agent_address
from .._errors import InvalidArgument
from ..transport import Done, Held, JobRank, Located, Reserve, SegmentKey, Status, Stored
from ..wire import Connection, auth, decode, encode
from ._loop import run, submit

AGENT_TIMEOUT_S = 5.0
"""Seconds a call may take: a hung agent must not stall a training loop for long."""
LOCATE_TIMEOUT_S = 600.0
"""Seconds ``locate`` may take: it may copy gigabytes from a peer first."""


class AgentClient:
    """Calls to the memory agent at ``address`` (default: ``agent_address()``)."""

    def __init__(self, address: str | None = None, *, token: str | None = None) -> None:
        self.address = agent_address(address)
        host, _, port = self.address.rpartition(":")
        if not host or not port.isdigit():
            raise InvalidArgument(f"a memory agent's address is HOST:PORT, not {self.address!r}")
        self._token = auth.cluster_token(token)
        self._conn: Connection | None = None
        self._sent: Future[Any] | None = None

    def reserve(self, key: SegmentKey, size: int, *, to_store: bool = False) -> str:
        """A file of ``size`` bytes to write ``key``'s segment into (``NoSpace``: no room);
        ``to_store``: its step goes on to the store, so the agent keeps it until told it
        is ``stored``, else a newer step may supersede it."""
        path: str = self._call("agent.reserve", Reserve(key, size, to_store), str)
        return path

    def reserve_ahead(self, key: SegmentKey, size: int, *, to_store: bool = False) -> Future[str]:
        """``reserve``, sent now and answered later: the future holds the path (or the
        error). A rank asks for its next save's segment while it trains."""
        self.settle()
        ahead: Future[str] = submit(self._acall("agent.reserve", Reserve(key, size, to_store), str))
        return ahead

    def forget(self, key: SegmentKey) -> None:
        """Give back a reserved segment that was never written (a save that did not come)."""
        self._call("agent.forget", key, None)

    def drop(self, job: str) -> int:
        """Drop every segment of ``job`` (its own and peers' copies); how many there were."""
        dropped: int = self._call("agent.drop", job, int)
        return dropped

    def done(self, key: SegmentKey, ranges: list[tuple[int, int]], *, wait: bool = True) -> None:
        """``key``'s segment is written: complete; the agent hashes each of ``ranges``
        (``(offset, length)``: what a reader will read and check), then copies it to a
        peer. ``wait=False`` returns at once: the next call waits for the reply first (and
        raises its error)."""
        if wait:
            self._call("agent.done", Done(key, ranges), None)
        else:
            self.settle()
            self._sent = submit(self._acall("agent.done", Done(key, ranges), None))

    def stored(self, job: str, step: int) -> None:
        """The store holds ``step`` of ``job``: older segments may be dropped."""
        self._call("agent.stored", Stored(job, step), None)

    def steps(self, job: str, rank: int, world: int) -> list[int]:
        """Steps whose segment of ``rank`` is complete here or at a peer."""
        steps: list[int] = self._call("agent.steps", JobRank(job, rank, world), list[int])
        return steps

    def locate(self, key: SegmentKey) -> Located:
        """The local file holding ``key``'s complete segment, and the blake3 of each range
        its writer named, hashed by the agent (``NotFound``: none)."""
        located: Located = self._call("agent.locate", key, Located, LOCATE_TIMEOUT_S)
        return located

    def listing(self, job: str) -> list[Held]:
        """Every segment of ``job`` the agent holds."""
        held: list[Held] = self._call("agent.list", job, list[Held])
        return held

    def status(self) -> Status:
        """What the agent holds, against its limit."""
        status: Status = self._call("agent.status", None, Status)
        return status

    def close(self) -> None:
        try:
            self.settle()
        finally:
            self._close()

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            run(conn.close())

    def _call(self, op: str, body: object, kind: Any, timeout: float = AGENT_TIMEOUT_S) -> Any:
        self.settle()
        return run(self._acall(op, body, kind, timeout))

    def settle(self) -> None:
        """Wait for the reply to a call sent without waiting (``done(wait=False)``); raise
        its error. Every other call does this first."""
        sent, self._sent = self._sent, None
        if sent is not None:
            sent.result()

    async def _acall(
        self, op: str, body: object, kind: Any, timeout: float = AGENT_TIMEOUT_S
    ) -> Any:
        if self._conn is None or self._conn.closed:
            host, _, port = self.address.rpartition(":")
            self._conn = await Connection.open(host, int(port), timeout=AGENT_TIMEOUT_S)
        reply, _ = await self._conn.call(op, encode(body), token=self._token, timeout=timeout)
        return None if kind is None else decode(reply, kind)
