"""The memory tier of a ``CheckpointManager``: each rank's state in its node's agent.

A save copies the rank's state dict into a segment the node's agent
(``graben agent serve``) holds in shared memory (``_segment``), and marks it
done once every rank has copied; the segments outlive the training
processes. A step can be loaded back from memory only when every rank of the
same world size finds its own segment of it, at its agent or at that agent's
peer (``complete_step`` gathers that). Nothing here talks to other ranks
itself: the manager runs the collectives.
"""

from __future__ import annotations

import logging
from typing import Any

from graben.store import AgentClient, GrabenError, NoSpace, SegmentKey

from . import _segment

log = logging.getLogger("graben.checkpoint")


class MemoryTier:
    """One job's segments at this node's agent (``agent``: its ``HOST:PORT``)."""

    def __init__(self, job: str, agent: str | None, rank: int, world: int) -> None:
        self.job, self.rank, self.world = job, rank, world
        self.client = AgentClient(agent)

    def key(self, step: int) -> SegmentKey:
        return SegmentKey(self.job, step, self.rank, self.world)

    def stage(self, step: int, state_dict: dict[str, Any]) -> str | None:
        """Copy ``state_dict`` into a segment for ``step``; ``None`` if held, else why not."""
        if not _segment.holdable(state_dict):
            return "it holds tensor subclasses (DTensor); the memory tier holds plain tensors"
        layout = _segment.layout(state_dict)
        try:
            path = self.client.reserve(self.key(step), layout.size)
        except NoSpace as exc:
            return exc.message
        except GrabenError as exc:
            return f"the memory agent at {self.client.address} did not take it: {exc.message}"
        _segment.write(path, layout)
        return None

    def done(self, step: int) -> None:
        """Every rank holds ``step``: this rank's segment is complete."""
        self.client.done(self.key(step))

    def stored(self, step: int) -> None:
        """The store holds ``step``: the agent may let older segments go."""
        try:
            self.client.stored(self.job, step)
        except GrabenError as exc:  # the store holds it; memory only stays fuller
            log.warning("could not tell the memory agent step %d is stored: %s", step, exc)

    def views(self, step: int) -> Any:
        """``step``'s segment as a state dict of views of its memory (for the store's copy)."""
        return _segment.views(self.client.locate(self.key(step)))

    def steps(self) -> list[int]:
        """Steps whose segment of this rank this node's agent (or its peer) holds complete."""
        try:
            return self.client.steps(self.job, self.rank, self.world)
        except GrabenError as exc:
            log.warning(
                "the memory agent at %s: %s; loading from the store", self.client.address, exc
            )
            return []

    def load(self, step: int, state_dict: dict[str, Any]) -> None:
        """Load ``step`` from memory into ``state_dict`` in place."""
        _segment.load(self.client.locate(self.key(step)), state_dict)

    def close(self) -> None:
        self.client.close()
