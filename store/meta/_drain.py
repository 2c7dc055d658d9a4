"""Draining and removing data nodes: the operator's way to retire a node's host.

A node's state is recorded in the engine (``nodes.state``) and survives its
heartbeats. ``DrainNode`` sets it to ``"draining"``: placement puts nothing new
there (``_placement.py``), and the leader's repair rounds (``_repair.py``) count
its copies as missing, copy each chunk to another node (read from the draining
copy if it is the only one) and, in a later step of the round, ``sweep`` forgets the
draining copy of every chunk that has its copies elsewhere, so the node's files may
go. Erasure-coded pieces on it are made again elsewhere from the stripe's others.
A draining node that holds nothing is ``"drained"`` (``Health``). ``RemoveNode``
unregisters a stopped node, refused while it holds the only copy of anything.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence

import msgspec

from .._errors import NotFound, Refused
from .._types import NodeState
from ..transport import DrainNode, RemoveNode
from ._leader import fenced_write
from ._nodes import DRAINING, NodeRegistry, with_progress
from ._operations import handles
from ._repo import Degraded, Repository, Tx

log = logging.getLogger("graben.meta")
SWEEP_CHUNKS = 1000
"""Draining copies a round of repair forgets at most, per node."""


class Drains:
    """Node drains and removals over a repository; ``nodes`` tells which are alive."""

    def __init__(self, repo: Repository, nodes: NodeRegistry) -> None:
        self.repo = repo
        self._nodes = nodes

    @handles(DrainNode)
    def drain(self, node: str, undo: bool = False) -> NodeState:
        """Start moving every copy and piece off ``node`` (``undo``: put it back in service,
        its copies staying where they are now); the node as it stands."""
        state = "" if undo else DRAINING
        if not self.repo.transact(lambda tx: tx.nodes.set_node_state(node, state)):
            raise NotFound(f"no data node {node} is registered (see graben status)")
        log.warning("data node %s %s", node, "is back in service" if undo else "is draining")
        return self.standing(node)

    def standing(self, node: str) -> NodeState:
        """One node as ``Health`` shows it: its state and the copies it holds."""
        found = [n for n in with_progress(self.repo, self._nodes.listed()) if n.id == node]
        if not found:
            raise NotFound(f"no data node {node} is registered (see graben status)")
        return found[0]

    @handles(RemoveNode)
    def remove(self, node: str) -> None:
        """Unregister a stopped node and forget its copies; refused while it is alive or
        holds the only copy of any chunk or a piece of a stripe."""
        standing = self.standing(node)
        if standing.alive:
            raise Refused(
                f"data node {node} at {standing.address} is still running: stop it first "
                "(it is forgotten only once silent for the heartbeat timeout)"
            )

        def forget(tx: Tx) -> list[str]:
            only = tx.nodes.sole(node, 5)
            if not only:
                tx.nodes.forget_node(node)
            return only

        only = self.repo.transact(forget)
        if only:
            raise Refused(
                f"data node {node} holds the only copy of chunks or pieces (first: "
                f"{', '.join(only)}): drain it first (graben node drain {node}) and wait "
                "till status says drained"
            )
        log.warning("data node %s removed", node)

    def sweep(
        self, nodes: Sequence[NodeState], short: Collection[str], fence: int
    ) -> list[tuple[str, str]]:
        """Forget the draining copies of chunks not in ``short`` that have a copy on a node
        in service; those forgotten, ``(chunk, node)`` (their files may be deleted)."""
        serving = {n.id for n in nodes if n.alive and not n.state}
        leaving = [n.id for n in nodes if n.state]
        if not leaving:
            return []

        def forget(tx: Tx) -> list[tuple[str, str]]:
            gone = []
            for node in leaving:
                for chunk, holders in tx.nodes.copies_on(node, SWEEP_CHUNKS).items():
                    if chunk not in short and serving.intersection(holders):
                        tx.chunks.drop_replica(chunk, node)
                        gone.append((chunk, node))
            return gone

        return fenced_write(self.repo, fence, "forgetting draining copies", forget)


def leaving_copies(tx: Tx, found: list[Degraded], leaving: Collection[str]) -> list[Degraded]:
    """``found`` with each chunk's copies on the live draining nodes ``leaving`` (repair
    reads from them, never counts them)."""
    if not leaving or not found:
        return found
    held = tx.chunks.replicas(d.chunk.id for d in found)
    return [
        msgspec.structs.replace(
            d, draining=tuple(n for n in held.get(d.chunk.id, ()) if n in leaving)
        )
        for d in found
    ]
