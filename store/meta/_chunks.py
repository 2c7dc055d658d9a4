"""The chunk layer's records, as the metadata service keeps them.

``ChunkRecords`` works below names and files: pages of the chunk records and
of a chunk's users (fsck), the engine's own consistency check, copies
reported bad, repair's new copies and collection. The writes repair makes
take the leader's fence (``_leader.py``): a deposed leader's are refused.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from itertools import accumulate

from .._config import page_entries
from .._errors import InvalidArgument
from .._types import ChunkProblem, Collection
from ..transport import CheckMetadata, ChunkPage, ChunkRefs, ChunkUsers, Collectable, ReportBad
from ._drain import leaving_copies
from ._idempotency import write_once
from ._leader import fenced_write
from ._nodes import NodeRegistry
from ._operations import handles
from ._repo import Degraded, Forgotten, Repository, Tx

PAGE_BYTES = 64 * 1024
"""Most bytes of text in one page whose entries hold paths (up to 4 KiB each)."""
PAGE_INLINE_BYTES = 16 << 20
"""Bytes of chunks the engine keeps that one page of the chunk layer carries at most."""


class ChunkRecords:
    """Chunk operations over a repository; ``degraded`` asks ``nodes`` which are alive."""

    def __init__(self, repo: Repository, nodes: NodeRegistry) -> None:
        self.repo = repo
        self._nodes = nodes

    def known(self, chunks: Iterable[str]) -> set[str]:
        """Which of these chunk ids any metadata names (a chunk row, an extent, a replica)."""
        with self.repo.read() as tx:
            return tx.chunks.named(chunks)

    def live(self, chunks: Iterable[str]) -> set[str]:
        """Which of these chunk ids a file uses."""
        with self.repo.read() as tx:
            return set(tx.chunks.referenced(chunks))

    @handles(ChunkRefs)
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

    @handles(ChunkUsers)
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

    @handles(CheckMetadata)
    def check_metadata(self, limit: int = 0) -> list[ChunkProblem]:
        """Where the engine's tables contradict each other (the first page of it, at most
        ``PAGE_BYTES`` of text: paths may be long)."""
        with self.repo.read() as tx:
            found = tx.inconsistencies(page_entries(limit))
        sizes = accumulate(len(p.detail) + sum(map(len, p.paths)) + 200 for p in found)
        return [p for p, size in zip(found, sizes, strict=True) if size <= PAGE_BYTES] or found[:1]

    @handles(ReportBad)
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
        nodes = self._nodes.listed()
        alive = [n.id for n in nodes if n.alive and not n.state]  # a draining copy is short
        with self.repo.read() as tx:
            found = tx.chunks.degraded(alive, limit)
            return leaving_copies(tx, found, {n.id for n in nodes if n.alive and n.state})

    def record_copies(self, made: dict[str, tuple[str, ...]], fence: int | None = None) -> None:
        """Record the copies a round of repair has made, chunk -> new nodes, in one
        transaction (under ``fence``, if given)."""
        (first, nodes), more = next(iter(made.items())), len(made) - 1
        what = f"copies of {first} on {nodes}" + (f" and of {more} more chunks" if more else "")

        def record(tx: Tx) -> None:
            for chunk, copies in made.items():
                tx.chunks.add_replicas(chunk, copies)

        fenced_write(self.repo, fence, f"recording {what}", record)

    @handles(Collectable)
    def collectable(
        self, grace_s: float, limit: int = 0, *, key: str = ""
    ) -> list[tuple[str, tuple[str, ...], float]]:
        """Forget a page of chunks no file has used for ``grace_s`` seconds; their ids,
        the nodes whose copies may now go, and the cutoff (Unix seconds) they go under
        (a repeat of ``key`` gets the same page)."""
        if not grace_s >= 0:
            raise InvalidArgument(f"the grace period must be 0 seconds or more, not {grace_s}")
        if math.isinf(grace_s):
            return []
        kind = list[tuple[str, tuple[str, ...], float]]
        return write_once(self.repo, key, kind, lambda tx: _page(self._forget(tx, grace_s, limit)))

    def collect(self, grace_s: float, limit: int, fence: int | None = None) -> list[Forgotten]:
        """The leader's ``collectable``: a page forgotten under ``fence``, each chunk (and
        piece) with the nodes that held it and its cutoff (ns)."""
        what = f"collecting chunks unused for {grace_s} s"
        return fenced_write(self.repo, fence, what, lambda tx: self._forget(tx, grace_s, limit))

    @staticmethod
    def _forget(tx: Tx, grace_s: float, limit: int) -> list[Forgotten]:
        cutoff = time.time_ns() - int(grace_s * 1e9)
        return tx.chunks.forget_unreferenced(cutoff, page_entries(limit))

    def sweep(self, ids: list[str], cutoff_s: float, fence: int | None = None) -> list[str]:
        """Of chunk files found on a node, those no metadata names, recorded as collected
        under ``cutoff_s`` (``Chunks.orphaned``), under ``fence``: the ones to delete."""
        cutoff = int(cutoff_s * 1e9)
        what = f"sweeping {len(ids)} orphan chunk files"
        return fenced_write(self.repo, fence, what, lambda tx: tx.chunks.orphaned(ids, cutoff))

    def explained(self, ids: Iterable[str]) -> set[str]:
        """Which of these chunk ids collection forgot lately (a copy it could not delete)."""
        with self.repo.read() as tx:
            return set(tx.chunks.collected(ids))

    def expire_collected(self, older_than_s: float, fence: int | None = None) -> int:
        """Forget the records of chunks collected before ``older_than_s`` (a page)."""
        before = int(older_than_s * 1e9)
        what = "forgetting old records of collection"
        return fenced_write(
            self.repo, fence, what, lambda tx: tx.chunks.expire_collected(before, 10_000)
        )

    def collection(self) -> Collection:
        """What waits to be collected and what collection has freed (``grace_s`` unset)."""
        with self.repo.read() as tx:
            return tx.chunks.collection()


def _page(forgotten: list[Forgotten]) -> list[tuple[str, tuple[str, ...], float]]:
    """Forgotten chunks as ``Collectable`` replies with them."""
    return [(ref.id, nodes, cutoff / 1e9) for ref, nodes, cutoff in forgotten]
