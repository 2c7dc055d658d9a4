"""``AgentClient``: a rank's (and ``graben``'s) calls to its node's memory agent.

Call order for a save: ``reserve`` (a file of the segment's size, in shared
memory), write it, ``done``; once the store holds the step, ``stored``. For a
load: ``steps`` (what this rank could read back), then ``locate`` (the file,
fetched from a peer agent first if only a peer holds it), read it.
"""

from __future__ import annotations

from typing import Any

from .._config import agent_address
from ..transport import Held, JobRank, Reserve, SegmentKey, Status, Stored
from ..wire import Connection, auth, decode, encode
from ._loop import run

AGENT_TIMEOUT_S = 120.0
"""Seconds a call may take: ``locate`` may copy gigabytes from a peer first."""


class AgentClient:
    """Calls to the memory agent at ``address`` (default: ``agent_address()``)."""

    def __init__(self, address: str | None = None, *, token: str | None = None) -> None:
        self.address = agent_address(address)
        self._token = auth.cluster_token(token)
        self._conn: Connection | None = None

    def reserve(self, key: SegmentKey, size: int) -> str:
        """A file of ``size`` bytes to write ``key``'s segment into (``NoSpace``: no room)."""
        path: str = self._call("agent.reserve", Reserve(key, size), str)
        return path

    def done(self, key: SegmentKey) -> None:
        """``key``'s segment is written: complete, and copied to a peer."""
        self._call("agent.done", key, None)

    def stored(self, job: str, step: int) -> None:
        """The store holds ``step`` of ``job``: older segments may be dropped."""
        self._call("agent.stored", Stored(job, step), None)

    def steps(self, job: str, rank: int, world: int) -> list[int]:
        """Steps whose segment of ``rank`` is complete here or at a peer."""
        steps: list[int] = self._call("agent.steps", JobRank(job, rank, world), list[int])
        return steps

    def locate(self, key: SegmentKey) -> str:
        """The local file holding ``key``'s complete segment (``NotFound``: none)."""
        path: str = self._call("agent.locate", key, str)
        return path

    def listing(self, job: str) -> list[Held]:
        """Every segment of ``job`` the agent holds."""
        held: list[Held] = self._call("agent.list", job, list[Held])
        return held

    def status(self) -> Status:
        """What the agent holds, against its limit."""
        status: Status = self._call("agent.status", None, Status)
        return status

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            run(conn.close())

    def _call(self, op: str, body: object, kind: Any) -> Any:
        return run(self._acall(op, body, kind))

    async def _acall(self, op: str, body: object, kind: Any) -> Any:
        if self._conn is None or self._conn.closed:
            host, _, port = self.address.rpartition(":")
            self._conn = await Connection.open(host, int(port))
        reply, _ = await self._conn.call(
            op, encode(body), token=self._token, timeout=AGENT_TIMEOUT_S
        )
        return None if kind is None else decode(reply, kind)
