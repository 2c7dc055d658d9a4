"""The memory tier of a ``CheckpointManager``: each rank's state in its node's agent.

A save copies the rank's state dict into a segment the node's agent
(``graben agent serve``) holds in shared memory (``_segment``), and marks it
done once every rank has copied, naming the ranges a reader reads (the agent
hashes them, after its reply); the segments outlive the training processes.
A load checks every range it reads against the agent's hashes. A step
can be loaded back from memory only when every rank of the same world size
finds its own segment of it, at its agent or at that agent's peer
(``complete_step`` gathers that). Nothing here talks to other ranks
itself: the manager runs the collectives.
"""

from __future__ import annotations

import logging
import mmap
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from graben.store import AgentClient, GrabenError, NoSpace, SegmentKey, Timeout, Unavailable

from . import _segment
from ._state import Target, flat_keys

log = logging.getLogger("graben.checkpoint")
RETRY_S = 30.0
"""Seconds the memory tier is left alone after its agent failed to answer: saves go to
the store meanwhile, without waiting on it again each time."""


class MemoryTier:
    """One job's segments at this node's agent (``agent``: its ``HOST:PORT``)."""

    def __init__(self, job: str, agent: str | None, rank: int, world: int) -> None:
        self.job, self.rank, self.world = job, rank, world
        self.client = AgentClient(agent)
        self._maps = _segment.Mappings()
        self._last: tuple[int, mmap.mmap, _segment.Layout] | None = None
        """The step this rank last wrote, its mapping and its layout."""
        self._ahead: _Ahead | None = None
        """The segment asked for, while the loop trains, for the save expected next."""
        self._size = 0
        self._down_until = 0.0
        """Until when the agent is taken to be down (``time.monotonic()``)."""

    def key(self, step: int) -> SegmentKey:
        return SegmentKey(self.job, step, self.rank, self.world)

    def stage(self, step: int, state_dict: dict[str, Any], to_store: bool) -> str | None:
        """Copy ``state_dict`` into a segment for ``step``; ``None`` if held, else why not
        (``to_store``: the step goes on to the store, and is kept until it is there)."""
        if not _segment.holdable(state_dict):
            return "it holds tensor subclasses (DTensor); the memory tier holds plain tensors"
        if time.monotonic() < self._down_until:
            return f"the memory agent at {self.client.address} failed a moment ago"
        try:
            layout = _segment.layout(state_dict)
        except _segment.Unholdable as exc:
            return exc.message
        self._size = layout.size
        try:
            path = self._reserved(_Ahead(self.key(step), layout.size, to_store))
        except NoSpace as exc:
            return exc.message
        except GrabenError as exc:
            return self._failed(exc)
        try:
            memory = self._maps.of(path, layout.size)
        except OSError as exc:  # not a file of ours: the agent's directory is not its own
            return f"the memory agent's segment {path} cannot be used: {exc}"
        _segment.write_into(memory, layout)
        self._last = (step, memory, layout)
        return None

    def _reserved(self, want: _Ahead) -> str:
        """The segment ``want`` names: the one asked for ahead if it is that one."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            try:
                path = ahead.path.result()
            except GrabenError:
                path = None
            if path is not None and ahead.same(want):
                return path
            if path is not None:
                self.client.forget(ahead.key)
        return self.client.reserve(want.key, want.size, to_store=want.to_store)

    def done(self, step: int, gap: int, next_to_store: bool) -> None:
        """Every rank holds ``step``: this rank's segment is complete (the agent's reply
        is waited for at the next call, not here: the loop goes on meanwhile; the agent
        hashes the ranges a reader reads after it replies). The segment for the save
        expected ``gap`` steps on is asked for now, as it trains."""
        assert self._last is not None, "stage comes first"
        written, _, layout = self._last
        assert written == step, f"step {step} was not the last one staged ({written})"
        key = self.key(step + max(gap, 1))
        try:
            self.client.done(self.key(step), _segment.ranges(layout), wait=False)
            path = self.client.reserve_ahead(key, self._size, to_store=next_to_store)
        except GrabenError as exc:  # this rank's copy stays incomplete: the step does too
            log.warning("step %d is not complete in memory: %s", step, self._failed(exc))
            return
        self._ahead = _Ahead(key, self._size, next_to_store, path)

    def _failed(self, exc: GrabenError) -> str:
        """Why the agent did not take a save, and the tier left alone for a while."""
        if isinstance(exc, Unavailable | Timeout):
            self._down_until = time.monotonic() + RETRY_S
            self._ahead = None
            return (
                f"the memory agent at {self.client.address} did not answer ({exc.message}); "
                f"saves go to the store for {RETRY_S:.0f} s"
            )
        return f"the memory agent at {self.client.address} did not take it: {exc.message}"

    def stored(self, step: int) -> None:
        """The store holds ``step``: the agent may let older segments go."""
        if time.monotonic() < self._down_until:
            return  # the agent keeps what it must until a later step is stored
        try:
            self.client.stored(self.job, step)
        except GrabenError as exc:  # the store holds it; memory only stays fuller
            why = self._failed(exc)
            log.warning("could not tell the memory agent step %d is stored: %s", step, why)

    def views(self, step: int) -> Any:
        """``step``'s segment, just written, as a state dict of views of its memory (what
        the store's copy is made from)."""
        assert self._last is not None, "stage comes first"
        written, memory, layout = self._last
        assert written == step, f"step {step} was not the last one staged ({written})"
        return _segment.views_of(memory, layout)

    def steps(self) -> list[int]:
        """Steps whose segment of this rank this node's agent (or its peer) holds complete."""
        try:
            return self.client.steps(self.job, self.rank, self.world)
        except GrabenError as exc:
            log.warning(
                "the memory agent at %s: %s; loading from the store", self.client.address, exc
            )
            return []

    def load(self, step: int, target: Target) -> None:
        """Load ``step`` from memory into ``target`` in place, every range read checked
        against the agent's hash of it (``IntegrityError``: it differs; ``InvalidArgument``:
        ``target.check`` refuses what the step holds)."""
        located = self.client.locate(self.key(step))

        def check(saved: Any) -> None:
            target.check(flat_keys(saved))

        _segment.load(located.path, located.sums, target.plain, check)

    def close(self) -> None:
        """Give back the segment reserved ahead, and let go of the agent and the mappings."""
        ahead, self._ahead = self._ahead, None
        try:
            if ahead is not None and ahead.path.exception() is None:
                self.client.forget(ahead.key)
            self.client.close()
        except GrabenError as exc:  # the agent went away: it reclaims what it held itself
            log.warning("the memory agent at %s: %s", self.client.address, exc.message)
        finally:
            self._maps.close()


@dataclass(frozen=True, slots=True)
class _Ahead:
    """A segment reserved for a save: asked for now, or ahead of the save."""

    key: SegmentKey
    """Whose state, at which step."""
    size: int
    """Its bytes."""
    to_store: bool
    """Whether the step goes on to the store."""
    path: Future[str] = field(default_factory=Future, compare=False)
    """Its file, once the agent answers (ahead of the save only)."""

    def same(self, other: _Ahead) -> bool:
        return (self.key, self.size, self.to_store) == (other.key, other.size, other.to_store)
