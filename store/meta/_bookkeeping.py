"""The chunk layer's and the node registry's records, as the metadata service keeps them.

``Bookkeeping`` is the half of ``Namespace`` that works below names and
files: pages of the chunk records and of a chunk's users (fsck), the
engine's own consistency check, heartbeats and the node registry, health,
copies reported bad, repair's new copies and collection. ``Namespace``
inherits it, so one object executes every metadata request. The writes
repair makes take the leader's fence (``_leader.py``): a deposed leader's
are refused.
"""

from __future__ import annotations

import math
import time
from itertools import accumulate

import msgspec

from .._config import page_entries
from .._errors import InvalidArgument, PermissionDenied
from .._types import ChunkProblem, Health, NodeState
from ..transport import ChunkPage, Joined
from ._leader import GONE_S, fenced_write
from ._once import write_once
from ._placement import LOCAL_NODE
from ._repo import Degraded, Repository, Tx, encrypted

PAGE_BYTES = 64 * 1024
"""Most bytes of text in one page whose entries hold paths (up to 4 KiB each)."""
PAGE_INLINE_BYTES = 16 << 20
"""Bytes of chunks the engine keeps that one page of the chunk layer carries at most."""


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
    inline_max: int
    """Largest chunk the engine keeps itself (a small file's bytes); 0: none."""

    def chunk_refs(self, after: str = "", limit: int = 0) -> ChunkPage:
        """A page of the chunk layer: chunks with ids after ``after``."""
        with self.repo.read() as tx:
            chunks, last = tx.chunks.chunk_page(after, page_entries(limit))
            nowhere = [chunk.id for chunk, nodes in chunks if not nodes]
            stripes = tx.stripes.stripes(nowhere) if nowhere else {}
            inline = tx.chunks.inline(c for c in nowhere if c not in stripes)
        size = 0
        for index, (chunk, _) in enumerate(chunks):  # a page of bytes stays a page
            size += len(inline.get(chunk.id, b""))
            if size > PAGE_INLINE_BYTES and index + 1 < len(chunks):
                kept = chunks[: index + 1]
                held = {c.id: inline[c.id] for c, _ in kept if c.id in inline}
                striped = {c.id: stripes[c.id] for c, _ in kept if c.id in stripes}
                return ChunkPage(kept, chunk.id, inline=held, stripes=striped)
        return ChunkPage(chunks, last, inline=inline, stripes=stripes)

    def chunk_users(self, chunk: str, after: int = 0, limit: int = 0) -> list[tuple[int, str]]:
        """A page of the files using a chunk: ``(inode, path)``, ``""`` for an unnamed inode.

        Ends early once its paths reach ``PAGE_BYTES``; an empty page is the end.
        """
        page: list[tuple[int, str]] = []
        size = 0
        with self.repo.read() as tx:
            for inode in tx.files.chunk_users(chunk, after, page_entries(limit)):
                path = tx.tree.path_of(inode) or ""
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

    def heartbeat(self, node: NodeState, store_id: str = "", sealed: str = "none") -> Joined:
        """Record that a data node is alive, unless it belongs to another store or its
        encryption at rest (``sealed``: its key's check value, or ``"none"``) is not the
        store's. The first node to join records the store's (a store that is encrypted
        stays so); one that differs is not recorded, so nothing is placed on it, and the
        reply says what the store's is (the node refuses to serve)."""
        if store_id and store_id != self.store_id:
            raise PermissionDenied(
                f"data node {node.id} at {node.address} belongs to store {store_id}, but "
                f"this metadata service serves store {self.store_id}: is its --engine the "
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
        return Joined(self.store_id, self.default_replication, sealed=recorded)

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
            self.inline_max = 0

    def nodes(self) -> list[NodeState]:
        """Registered data nodes, ``alive`` if heard from within the timeout."""
        with self.repo.read() as tx:
            found = tx.nodes.nodes()
            self.heed_sealing(tx.identity.sealed())
        cutoff = time.time() - self.heartbeat_timeout
        return [msgspec.structs.replace(n, alive=n.last_seen >= cutoff) for n in found]

    def report_bad(self, chunk: str, node: str, reason: str, fence: int | None = None) -> None:
        """Forget a copy a reader found damaged; repair will delete it and place a new one.

        ``fence``: repair's own report, refused if its leader has been deposed.
        """

        def forget(tx: Tx) -> None:
            tx.chunks.drop_replica(chunk, node)
            tx.bad.add_bad(chunk, node, reason)

        fenced_write(self.repo, fence, f"forgetting the copy of {chunk} on {node}", forget)

    def bad_copies(self, limit: int = 1000) -> list[tuple[str, str, str]]:
        """Copies reported damaged and not yet deleted: (chunk, node, reason)."""
        with self.repo.read() as tx:
            return tx.bad.bad_copies(limit)

    def bad_count(self) -> int:
        """How many copies reported damaged await deletion."""
        with self.repo.read() as tx:
            return tx.bad.bad_count()

    def forget_bad(self, chunk: str, node: str, fence: int | None = None) -> None:
        """Repair has dealt with a damaged copy (under ``fence``, if given)."""
        what = f"forgetting the damaged copy of {chunk}"
        fenced_write(self.repo, fence, what, lambda tx: tx.bad.forget_bad(chunk, node))

    def degraded(self, limit: int = 1000) -> list[Degraded]:
        """Referenced chunks short of copies on live nodes (what repair works on)."""
        alive = [n.id for n in self.nodes() if n.alive]
        with self.repo.read() as tx:
            return tx.chunks.degraded(alive, limit)

    def health(self) -> Health:
        """Nodes, how many chunks are short of copies or of pieces (counted up to 100,000
        each), the metadata services and which of them leads."""
        nodes = self.nodes()
        alive = [n.id for n in nodes if n.alive]
        with self.repo.read() as tx:
            # Embedded stores have no registry: their one node is always there.
            short = len(tx.chunks.degraded(alive or [LOCAL_NODE], 100_000))
            short += len(tx.stripes.short_stripes(alive or [LOCAL_NODE], 100_000))
            bad, now, lease, services = (
                tx.bad.bad_count(),
                tx.services.now(),
                tx.services.lease(),
                tx.services.services(),
            )
        return Health(
            nodes,
            short,
            bad,
            self.default_replication,
            self.store_id,
            [msgspec.structs.replace(s, alive=s.last_seen >= now - GONE_S) for s in services],
            lease.holder if lease.expires > now else "",
            lease.fence,
            self.repo.location,
        )

    def record_copies(self, made: dict[str, tuple[str, ...]], fence: int | None = None) -> None:
        """Record the copies a round of repair has made, chunk -> new nodes, in one
        transaction (under ``fence``, if given)."""
        (first, nodes), more = next(iter(made.items())), len(made) - 1
        what = f"copies of {first} on {nodes}" + (f" and of {more} more chunks" if more else "")

        def record(tx: Tx) -> None:
            for chunk, copies in made.items():
                tx.chunks.add_replicas(chunk, copies)

        fenced_write(self.repo, fence, f"recording {what}", record)

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
            gone = tx.chunks.forget_unreferenced(cutoff, page_entries(limit))
            return [(chunk.id, nodes) for chunk, nodes in gone]

        return write_once(self.repo, key, list[tuple[str, tuple[str, ...]]], forget)
