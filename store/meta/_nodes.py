"""The data nodes' registry and the store's identity, as the metadata service keeps them.

``NodeRegistry`` records heartbeats (refusing a node of another store, or one
whose encryption at rest is not the store's), lists the nodes with who is
alive, and tells the store's health: nodes, chunks short of copies, copies
reported bad, the metadata services and which of them leads. ``Vigil`` logs a
node going dead and coming back, once each (the leader keeps one).
"""

from __future__ import annotations

import logging
import time

import msgspec

from .._errors import PermissionDenied
from .._types import Health, NodeState
from ..transport import GetHealth, GetStoreId, Heartbeat, Joined, ListNodes, RestorePoint
from ._operations import handles
from ._placement import LOCAL_NODE
from ._policy import Policy
from ._repo import GONE_S, Repository, Tx, encrypted

DRAINING = "draining"
"""A node's state while its copies move off (``meta/_drain.py``)."""
DRAINED = "drained"
"""A draining node that holds nothing any more (shown, never recorded)."""

log = logging.getLogger("graben.meta")


class Vigil:
    """Which data nodes were alive when last looked at: a warning when one goes dead
    (no heartbeat within the timeout), a line when it comes back, once each."""

    def __init__(self) -> None:
        self._alive: dict[str, bool] = {}

    def look(self, nodes: list[NodeState], timeout: float) -> None:
        """Log each node whose liveness changed since the last look (one dead at the
        first look is logged too)."""
        now = time.time()
        for node in nodes:
            was = self._alive.get(node.id, True)
            self._alive[node.id] = node.alive
            # Each line its own template: the log's filter of repeats holds back alike
            # ones, and two nodes that die together are two events.
            if was and not node.alive:
                quiet = now - node.last_seen
                log.warning(
                    f"data node {node.id} ({node.address}, rack {node.rack}) is dead: "
                    f"no heartbeat for {quiet:.0f} s (timeout {timeout:g} s)"
                )
            elif node.alive and not was:
                log.info(f"data node {node.id} ({node.address}) is back: it heartbeats again")


class NodeRegistry:
    """Node operations over a repository; learns the store's sealing into ``policy``."""

    def __init__(self, repo: Repository, policy: Policy) -> None:
        self.repo = repo
        self.policy = policy
        with repo.read() as tx:
            self.heed_sealing(tx.identity.sealed())

    @handles(GetStoreId)
    def store_id(self) -> str:
        """The store's id: data nodes and capabilities of another store are refused."""
        return self.policy.store_id

    @handles(RestorePoint)
    def restore_point(self) -> int:
        """When the backup this store was restored from was taken (0: never restored)."""
        with self.repo.read() as tx:
            return tx.identity.restored_ns()

    @handles(Heartbeat)
    def heartbeat(self, node: NodeState, store_id: str = "", sealed: str = "none") -> Joined:
        """Record that a data node is alive, unless it belongs to another store or its
        encryption at rest (``sealed``: its key's check value, or ``"none"``) is not the
        store's. The first node to join records the store's (a store that is encrypted
        stays so); one that differs is not recorded, so nothing is placed on it, and the
        reply says what the store's is (the node refuses to serve)."""
        if store_id and store_id != self.policy.store_id:
            raise PermissionDenied(
                f"data node {node.id} at {node.address} belongs to store {store_id}, but "
                f"this metadata service serves store {self.policy.store_id}: is its --engine the "
                "right database? The node was not let in"
            )
        seen = msgspec.structs.replace(node, last_seen=time.time())

        def beat(tx: Tx) -> str:
            recorded = tx.identity.sealed() or tx.identity.seal(sealed)
            if recorded == sealed:
                tx.nodes.upsert_node(seen)
            return recorded

        recorded = self.repo.transact(beat)
        self.heed_sealing(recorded)
        return Joined(self.policy.store_id, self.policy.default_replication, sealed=recorded)

    def sealed(self, check: str) -> str:
        """The store's encryption at rest (a key's check value, or ``"none"``), ``check``
        recorded first if nothing is yet (an embedded store's first open)."""
        with self.repo.read() as tx:
            recorded = tx.identity.sealed()
        recorded = recorded or self.repo.transact(lambda tx: tx.identity.seal(check))
        self.heed_sealing(recorded)
        return recorded

    def heed_sealing(self, recorded: str) -> None:
        """An encrypted store keeps no file's bytes in its engine, where they would be its
        only plaintext at rest: once the store records a key (``recorded``), this service
        keeps nothing inline, tells its writers so (``Settings``) and refuses inline bytes.
        Learned at start, from the heartbeats it answers and each time it lists the nodes."""
        if encrypted(recorded):
            self.policy.inline_max = 0

    @handles(ListNodes)
    def listed(self) -> list[NodeState]:
        """Registered data nodes, ``alive`` if heard from within the timeout."""
        with self.repo.read() as tx:
            found = tx.nodes.nodes()
            self.heed_sealing(tx.identity.sealed())
        cutoff = time.time() - self.policy.heartbeat_timeout
        return [msgspec.structs.replace(n, alive=n.last_seen >= cutoff) for n in found]

    @handles(GetHealth)
    def health(self) -> Health:
        """Nodes (each with its state and the copies it holds), how many chunks are short
        of copies or of pieces (counted up to 100,000 each), the metadata services and
        which of them leads."""
        nodes = with_progress(self.repo, self.listed())
        alive = [n.id for n in nodes if n.alive]
        with self.repo.read() as tx:
            # Embedded stores have no registry: their one node is always there.
            short = len(tx.chunks.degraded(alive or [LOCAL_NODE], 100_000))
            short += len(tx.stripes.short_stripes(alive or [LOCAL_NODE], 100_000))
            bad, collection, now, lease, services = (
                tx.bad.bad_count(),
                tx.chunks.collection(),
                tx.services.now(),
                tx.services.lease(),
                tx.services.services(),
            )
        return Health(
            nodes,
            short,
            bad,
            self.policy.default_replication,
            self.policy.store_id,
            [msgspec.structs.replace(s, alive=s.last_seen >= now - GONE_S) for s in services],
            lease.holder if lease.expires > now else "",
            lease.fence,
            self.repo.location,
            msgspec.structs.replace(collection, grace_s=self.policy.collect_grace_s),
        )


def with_progress(repo: Repository, nodes: list[NodeState]) -> list[NodeState]:
    """``nodes`` with the copies each holds, a draining one that holds none ``drained``."""
    with repo.read() as tx:
        held = tx.nodes.held()
    return [
        msgspec.structs.replace(
            n,
            held=held.get(n.id, 0),
            state=DRAINED if n.state == DRAINING and not held.get(n.id) else n.state,
        )
        for n in nodes
    ]
