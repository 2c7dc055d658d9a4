"""Storage classes as the metadata service keeps them: set on paths, found for the
leader's conversions, and erasure-coded chunks recorded.

A class is set on a directory or a file (``set_class``); a
file's class is its own, else its nearest directory's (``class_of``), so
files made under a directory take its class, and so do files moved in. The
leader asks ``to_convert`` for chunks whose files' class says erasure-coded
and which are still replicated, converts them (``_service.py``) and records
each stripe with ``record_stripe``, one transaction that swaps the chunk's
replicas for its pieces and queues the old copies for deletion; repair asks
``short_stripes`` and records with ``record_pieces``. Conversions and repairs
write under the leader's fence.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .. import _paths
from .._classes import StorageClass, parse
from .._errors import InvalidArgument
from .._types import ChunkRef, ClassState, Stripe
from ..transport import GetClass, SetClass
from ._idempotency import write_once
from ._leader import fenced_write
from ._operations import handles
from ._repo import ROOT_INODE, Repository, Tx
from ._walk import resolve

WALK_MAX = 100_000
"""Files one round's look for work visits at most (the rest wait for the next round)."""


@dataclass(frozen=True, slots=True)
class Conversion:
    """A replicated chunk whose file's class wants it kept otherwise."""

    chunk: ChunkRef
    """The chunk."""
    replicas: tuple[str, ...]
    """The nodes holding its copies now."""
    target: StorageClass
    """The class it is to take."""


class Classes:
    """Class operations over a repository."""

    def __init__(self, repo: Repository) -> None:
        self.repo = repo
        self.kinds = frozenset({"replicated", "ec"})
        """The classes this store can keep (``s3`` too, with an S3 tier)."""

    @handles(SetClass)
    def set_class(self, path: str, name: str, key: str = "") -> str:
        """Set (``""``: clear) the class of a path; its canonical name."""
        target = parse(name) if name else None
        if target is not None and target.kind not in self.kinds:
            raise InvalidArgument(
                f"this store has no S3 tier for class {target.name}: its metadata services "
                "and data nodes take one with --s3-tier s3://BUCKET/PREFIX"
            )
        canonical = target.name if target is not None else ""
        parts = _paths.split(path)

        def apply(tx: Tx) -> str:
            tx.stripes.set_class(resolve(tx, parts, path).id, canonical)
            return canonical

        return write_once(self.repo, key, str, apply)

    @handles(GetClass)
    def class_of(self, path: str) -> ClassState:
        """The class in force at a path, where it was set, and (a file) how far its chunks
        have been converted."""
        parts = _paths.split(path)
        with self.repo.read() as tx:
            chain = tx.tree.walk(parts) if parts else []
            node = resolve(tx, parts, path)
            ids = [ROOT_INODE, *(n.id for n in chain)]
            set_on = tx.stripes.classes(ids)
            depth = max((d for d, i in enumerate(ids) if i in set_on), default=-1)
            name = set_on[ids[depth]] if depth >= 0 else ""
            source = _paths.join_parts(parts[:depth]) if depth >= 0 else ""
            if node.kind != "file":
                return ClassState(name, source)
            chunks = {x.chunk.id for x in tx.files.extents(node.id)}
            chunks -= tx.chunks.inline(chunks).keys()  # a small file's: the engine's, no class
            converted = len(tx.stripes.stripes(chunks)) if chunks else 0
        return ClassState(name, source, len(chunks), converted)

    def to_convert(
        self, limit: int, now_ns: int | None = None, kinds: frozenset[str] = frozenset({"ec"})
    ) -> list[Conversion]:
        """Up to ``limit`` replicated chunks of files whose class is one of ``kinds`` and
        which are unchanged for the class's age."""
        now = time.time_ns() if now_ns is None else now_ns
        found: list[Conversion] = []
        with self.repo.read() as tx:
            classed = dict(tx.stripes.classed())
            for inode, name in classed.items():
                target = parse(name)
                if target.kind not in kinds:
                    continue
                cutoff = now - target.after_s * 1_000_000_000
                files = list(_files(tx, inode, classed, cutoff))
                for chunk, nodes in (
                    tx.stripes.unstriped(files, limit - len(found)) if files else ()
                ):
                    found.append(Conversion(chunk, nodes, target))
                if len(found) >= limit:
                    break
        return found

    def record_stripe(
        self, chunk: str, stripe: Stripe, why: str, fence: int | None = None
    ) -> tuple[str, ...]:
        """Swap a chunk's replicas for its pieces (already durable on their nodes), the
        old copies queued for deletion (``why``); the nodes that held them (none if the
        chunk was striped already)."""

        def swap(tx: Tx) -> tuple[str, ...]:
            old = tx.stripes.stripe(chunk, stripe)
            for node in old:
                tx.bad.add_bad(chunk, node, why)
            return old

        return fenced_write(self.repo, fence, f"recording the stripe of {chunk}", swap)

    def short_stripes(
        self, alive: Iterable[str], limit: int = 1000
    ) -> list[tuple[ChunkRef, Stripe]]:
        """Referenced erasure-coded chunks with a piece on no live node."""
        with self.repo.read() as tx:
            return tx.stripes.short_stripes(alive, limit)

    def record_pieces(
        self, moved: list[tuple[str, int, str, str]], fence: int | None = None
    ) -> None:
        """Record pieces repair made again: (chunk, index, node it was on, node now)."""

        def record(tx: Tx) -> None:
            for chunk, index, was, node in moved:
                tx.stripes.place_piece(chunk, index, was, node)

        fenced_write(self.repo, fence, f"recording {len(moved)} pieces made again", record)


def _files(tx: Tx, top: int, classed: dict[int, str], cutoff_ns: int) -> Iterator[int]:
    """Files at or below inode ``top`` unchanged since ``cutoff_ns``, not below another
    directory with a class of its own (that one's class rules them)."""
    node = tx.tree.get(top)
    if node is None:
        return
    if node.kind == "file":
        if node.mtime_ns <= cutoff_ns:
            yield node.id
        return
    pending, seen = [top], 0
    while pending and seen < WALK_MAX:
        for _, child in tx.tree.children(pending.pop()):
            seen += 1
            if child.id in classed:
                continue
            if child.kind == "directory":
                pending.append(child.id)
            elif child.mtime_ns <= cutoff_ns:
                yield child.id
