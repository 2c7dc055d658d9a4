"""The bodies of a memory agent's calls: what ranks, peer agents and ``graben`` send it."""

from __future__ import annotations

import msgspec

from .._errors import InvalidArgument

MAX_JOB = 1024
"""Longest job name (a checkpoint root's URL) an agent takes."""
MAX_WORLD = 1 << 20
"""Largest world size an agent takes."""
MAX_RANGES = 1 << 20
"""Most ranges of a segment its writer may ask the agent to hash."""


class SegmentKey(msgspec.Struct, frozen=True, array_like=True):
    """One rank's state at one step of one job."""

    job: str
    """The job's name: the checkpoint root's URL."""
    step: int
    """The training step."""
    rank: int
    """The rank whose state it is."""
    world: int
    """The world size it was saved at (a segment is only for that world size)."""

    def check(self) -> SegmentKey:
        """``self``, or ``InvalidArgument`` if a field is out of range."""
        if not 0 < len(self.job) <= MAX_JOB or "\0" in self.job:
            raise InvalidArgument(f"a job name has 1 to {MAX_JOB} characters and no NUL")
        if self.step < 0 or not 0 <= self.rank < self.world <= MAX_WORLD:
            raise InvalidArgument(
                f"step {self.step}, rank {self.rank} of {self.world}: steps are >= 0 "
                f"and ranks in [0, world), world <= {MAX_WORLD}"
            )
        return self


class Held(msgspec.Struct, frozen=True, array_like=True):
    """A segment an agent holds."""

    key: SegmentKey
    """Whose state, at which step."""
    size: int
    """Its bytes."""
    complete: bool
    """Whether its writer finished it (an incomplete one is never read)."""
    peer: bool
    """Whether it is a copy kept for another host's agent."""
    to_store: bool = False
    """Whether its step is headed for the store: kept until the store holds it."""
    order: int = 0
    """When it was reserved, in the agent's count (a later one supersedes a partial one)."""


class Reserve(msgspec.Struct, frozen=True, array_like=True):
    """A rank asks for a segment file of ``size`` bytes to write (``to_store``: see ``Held``)."""

    key: SegmentKey
    size: int
    to_store: bool = False


class Done(msgspec.Struct, frozen=True, array_like=True):
    """A rank wrote ``key``'s segment: the agent hashes each of ``ranges`` of it (what a
    reader will read, ``(offset, length)`` each) and keeps their blake3s."""

    key: SegmentKey
    ranges: list[tuple[int, int]]

    def check(self, size: int) -> Done:
        """``self``, or ``InvalidArgument`` if a range lies outside ``size`` bytes."""
        if not 0 < len(self.ranges) <= MAX_RANGES:
            raise InvalidArgument(f"a segment is hashed in 1 to {MAX_RANGES} ranges")
        for offset, length in self.ranges:
            if offset < 0 or length <= 0 or offset + length > size:
                raise InvalidArgument(f"a range [{offset}, +{length}) outside {size} bytes")
        return self


class Located(msgspec.Struct, frozen=True, array_like=True):
    """Where a complete segment is, and the blake3 of each range its writer named, hashed
    by the agent once it was done (a reader checks what it reads against them)."""

    path: str
    size: int
    sums: list[tuple[int, int, bytes]]
    """``(offset, length, blake3)`` of each range."""


class JobRank(msgspec.Struct, frozen=True, array_like=True):
    """Which steps of one rank of a job are complete here (and, asked by a rank, at peers)."""

    job: str
    rank: int
    world: int


class Stored(msgspec.Struct, frozen=True, array_like=True):
    """The store holds ``step`` of ``job``: older segments may go."""

    job: str
    step: int


class Piece(msgspec.Struct, frozen=True, array_like=True):
    """Bytes ``[offset, offset + length)`` of a segment of ``size`` bytes, between peers."""

    key: SegmentKey
    size: int
    offset: int
    length: int
    sums: list[tuple[int, int, bytes]] = []
    """On a copy's last piece: the segment's sums (the receiving agent checks its copy)."""


class Status(msgspec.Struct, frozen=True, array_like=True):
    """What an agent holds, against its limit."""

    held_bytes: int
    limit_bytes: int
    segments: int
    peers: list[str]
