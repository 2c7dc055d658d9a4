"""The chunk layer's and the node registry's records, as the metadata service keeps them.

``Bookkeeping`` is the half of ``Namespace`` that works below names and
files: pages of the chunk records and of a chunk's users (fsck), the
engine's own consistency check, heartbeats and the node registry, health,
copies reported bad, repair's new copies and collection. ``Namespace``
inherits it, so one object executes every metadata request.
"""

from __future__ import annotations

import math
import time
from itertools import accumulate

import msgspec

from .._config import PAGE_BYTES, page_entries
from .._errors import InvalidArgument, PermissionDenied
from .._types import LOCAL_NODE, ChunkPage, ChunkProblem, Degraded, Health, Joined, NodeState
from ._once import write_once
from ._repo import Repository, Tx


class Bookkeeping:
    """Chunk and node operations over a repository (see ``Namespace``, which sets the
    attributes below)."""

    repo: Repository
    """The engine."""
    store_id: str
    """The store's id: data nodes and capabilities of another store are refused."""
    default_replication: int
    """Copies of each chunk unless a file asks otherwise."""
    heartbeat_timeout: float
    """Seconds after its last heartbeat a node counts as dead."""
    bad: list[tuple[str, str, str]]
    """Copies reported bad and not yet deleted: (chunk, node, reason)."""

    def chunk_refs(self, after: str = "", limit: int = 0) -> ChunkPage:
        """A page of the chunk layer: chunks with ids after ``after``."""
        with self.repo.read() as tx:
            chunks, last = tx.chunk_page(after, page_entries(limit))
        return ChunkPage(chunks, last)

    def chunk_users(self, chunk: str, after: int = 0, limit: int = 0) -> list[tuple[int, str]]:
        """A page of the files using a chunk: ``(inode, path)``, ``""`` for an unnamed inode.

        Ends early once its paths reach ``PAGE_BYTES``; an empty page is the end.
        """
        page: list[tuple[int, str]] = []
        size = 0
        with self.repo.read() as tx:
            for inode in tx.chunk_users(chunk, after, page_entries(limit)):
                path = tx.path_of(inode) or ""
                page.append((inode, path))
                size += len(path) + 16
                if size >= PAGE_BYTES:
                    break
        return page

    def check_metadata(self, limit: int = 0) -> list[ChunkProblem]:
        """Where the engine's tables contradict each other (the first page of it, at most
        ``PAGE_BYTES`` of text: paths may be long)."""
        with self.repo.read() as tx:
            found = tx.inconsistencies(page_entries(limit))
        sizes = accumulate(len(p.detail) + sum(map(len, p.paths)) + 200 for p in found)
        return [p for p, size in zip(found, sizes, strict=True) if size <= PAGE_BYTES] or found[:1]

    def heartbeat(self, node: NodeState, store_id: str = "") -> Joined:
        """Record that a data node is alive, unless it belongs to another store."""
        if store_id and store_id != self.store_id:
            raise PermissionDenied(
                f"data node {node.id} at {node.address} belongs to store {store_id}, but "
                f"this metadata service serves store {self.store_id}: is its --engine the "
                "right database? The node was not let in"
            )
        with self.repo.write() as tx:
            tx.upsert_node(msgspec.structs.replace(node, last_seen=time.time()))
        return Joined(self.store_id, self.default_replication)

    def nodes(self) -> list[NodeState]:
        """Registered data nodes, ``alive`` if heard from within the timeout."""
        with self.repo.read() as tx:
            found = tx.nodes()
        cutoff = time.time() - self.heartbeat_timeout
        return [msgspec.structs.replace(n, alive=n.last_seen >= cutoff) for n in found]

    def report_bad(self, chunk: str, node: str, reason: str) -> None:
        """Forget a copy a reader found damaged; repair will place a new one."""
        with self.repo.write() as tx:
            tx.drop_replica(chunk, node)
        self.bad.append((chunk, node, reason))

    def degraded(self, limit: int = 1000) -> list[Degraded]:
        """Referenced chunks short of copies on live nodes (what repair works on)."""
        alive = [n.id for n in self.nodes() if n.alive]
        with self.repo.read() as tx:
            return tx.degraded(alive, limit)

    def health(self) -> Health:
        """Nodes, and how many chunks are short of copies (counted up to 100,000)."""
        nodes = self.nodes()
        alive = [n.id for n in nodes if n.alive]
        with self.repo.read() as tx:
            # Embedded stores have no registry: their one node is always there.
            short = tx.degraded(alive or [LOCAL_NODE], 100_000)
        return Health(nodes, len(short), len(self.bad), self.default_replication, self.store_id)

    def add_replicas(self, chunk: str, nodes: tuple[str, ...]) -> None:
        """Record copies repair has made."""
        with self.repo.write() as tx:
            tx.add_replicas(chunk, nodes)

    def collectable(
        self, grace_s: float, limit: int = 0, *, key: str = ""
    ) -> list[tuple[str, tuple[str, ...]]]:
        """Forget a page of chunks no file has used for ``grace_s`` seconds; their ids and
        the nodes whose copies may now go (a repeat of ``key`` gets the same page)."""
        if not grace_s >= 0:
            raise InvalidArgument(f"the grace period must be 0 seconds or more, not {grace_s}")
        if math.isinf(grace_s):
            return []
        cutoff = time.time_ns() - int(grace_s * 1e9)

        def forget(tx: Tx) -> list[tuple[str, tuple[str, ...]]]:
            gone = tx.forget_unreferenced(cutoff, page_entries(limit))
            return [(chunk.id, nodes) for chunk, nodes in gone]

        return write_once(self.repo, key, list[tuple[str, tuple[str, ...]]], forget)
