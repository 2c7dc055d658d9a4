"""fsck and collection, written once over the transport seam.

Call order of one run: the store's id; every chunk record, a page at a time,
each copy re-read (crc32c, checked by the transport) and re-hashed (blake3,
against the chunk's id); the engine's own cross-check; each node's chunk
files and temporaries, a page at a time; then, with ``collect``, the
refusals below and the deletions (a chunk no file uses goes under its own
cutoff: a copy written since it lost its last reference stays); last, what
waits to be collected and what was freed (``GetHealth``'s). Every list arrives
in pages (no store is too large for a reply), and memory holds only the ids of
the chunks the metadata names.

Collection deletes nothing if the metadata contradicts itself, if a node's
chunk files cannot be shown to be this metadata's (its ``store-id`` was
missing and taken from the metadata over chunks already there), or if far more
chunk files are orphans than a crashed writer leaves (more than
10% of all copies, and more than 64: ``too_many_orphans``): that is what a
wrong, empty or restored-from-old metadata database looks like, and
collecting then would delete live data. ``force`` overrides both. A
metadata database restored from a backup (``graben meta restore``) says when
that backup was taken: the chunk files written after it are orphans as
expected and do not count towards the refusal.

A data node that is dead (no heartbeat within the timeout) or stops answering
is not waited on: the run checks the rest, and reports each such node once, as
an ``unreachable`` problem with how many of its copies went unchecked; nothing
is deleted from it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Literal

from .._buffers import BufferPool
from .._config import too_many_orphans
from .._errors import (
    GrabenError,
    IntegrityError,
    InvalidArgument,
    NotFound,
    ProtocolError,
    Timeout,
    Unavailable,
)
from .._hashing import content_id, crc32c
from .._types import ChunkProblem, ChunkRef, FsckReport, Stripe
from ..transport import (
    CheckMetadata,
    ChunkRefs,
    ChunkTransport,
    ChunkUsers,
    Collectable,
    GetHealth,
    GetStoreId,
    ListNodes,
    MetaTransport,
    RestorePoint,
)
from ._reader import Report

Progress = Callable[[int], None]
QUIET_S = 60.0
"""A temporary untouched this long is reported (a live writer's is seconds old)."""


@dataclass
class _Found:
    """What a run has found so far."""

    problems: list[ChunkProblem] = field(default_factory=list)
    known: set[str] = field(default_factory=set)
    """Chunk ids the metadata names: never orphans."""
    chunks: int = 0
    bytes: int = 0
    orphans: list[tuple[str, str, float]] = field(default_factory=list)
    """(node, chunk id, mtime) of each orphan copy."""
    held: int = 0
    """Chunk files on the nodes, all of them."""
    unreachable: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Node -> why it is not checked (dead, or not answering) and its copies unchecked."""


class Fsck:
    """One fsck run over a store's transports (see the module docstring)."""

    def __init__(
        self,
        meta: MetaTransport,
        chunks: ChunkTransport,
        pool: BufferPool,
        hasher: Executor,
        *,
        io_threads: int,
        report: Report | None = None,
        progress: Progress | None = None,
    ) -> None:
        self._meta, self._chunks, self._pool, self._hasher = meta, chunks, pool, hasher
        self._slots = asyncio.Semaphore(io_threads)
        self._report, self._progress = report, progress
        self._found = _Found()
        self._store = ""
        self._restored = 0.0
        """When the backup the metadata was restored from was taken (0: never restored)."""
        self._addresses: dict[str, str] = {}
        """Each registered data node's address."""

    async def run(self, *, collect: bool, grace: float, force: bool) -> FsckReport:
        """Check everything; with ``collect``, delete what is older than ``grace`` seconds."""
        if not grace >= 0:
            raise InvalidArgument(f"the grace period must be 0 seconds or more, not {grace}")
        self._store = await self._meta.request(GetStoreId())
        self._restored = await self._restore_point()
        await self._skip_dead()
        await self._check_chunks()
        inconsistent = await self._check_metadata()
        nodes = await self._chunks.nodes()
        await self._on_each(nodes, self._find_orphans)
        cutoff = time.time() - grace
        quiet_since = time.time() - min(grace, QUIET_S)
        await self._on_each(nodes, lambda node: self._find_temporaries(node, quiet_since))
        nodes = tuple(n for n in nodes if n not in self._found.unreachable)
        collected = 0
        if collect:
            adopted = [n for n in nodes if await self._chunks.adoption(n, self._store)]
            self._may_collect(inconsistent, cutoff, force, adopted)
            collected = await self._collect(nodes, grace, cutoff)
            for node in adopted:  # forced: whoever forced it vouched for them
                await self._chunks.adoption(node, self._store, vouch=True)
        found = self._found
        for node, (why, unchecked) in found.unreachable.items():
            where = f"{node}@{self._addresses.get(node, '?')}"
            detail = f"data node {node} is {why}: {unchecked} copies on it not checked"
            found.problems.append(ChunkProblem("unreachable", "", where, (), detail))
        health = await self._meta.request(GetHealth())
        problems = tuple(found.problems)
        return FsckReport(found.chunks, found.bytes, problems, collected, health.collection)

    async def _restore_point(self) -> float:
        try:
            return await self._meta.request(RestorePoint()) / 1e9
        except ProtocolError:  # a service older than restores: one never restored (stricter)
            return 0.0

    async def _skip_dead(self) -> None:
        """Nodes that are dead now are not waited on: their copies go unchecked."""
        for state in await self._meta.request(ListNodes()):
            self._addresses[state.id] = state.address
            if not state.alive:
                quiet = time.time() - state.last_seen
                self._unreachable(state.id, f"dead (no heartbeat for {quiet:.0f} s)")

    async def _on_each(self, nodes: Iterable[str], step: Callable[[str], Awaitable[None]]) -> None:
        """``step`` on each node still reachable; one that stops answering is left be."""
        for node in nodes:
            if node in self._found.unreachable:
                continue
            try:
                await step(node)
            except (Unavailable, Timeout) as exc:
                self._unreachable(node, f"not answering ({exc.message})")

    def _unreachable(self, node: str, why: str) -> None:
        """Check nothing more on ``node``: it is dead, or did not answer."""
        self._found.unreachable.setdefault(node, (why, 0))

    # -- the metadata's chunks -----------------------------------------------------

    async def _check_chunks(self) -> None:
        after = None
        while after != "":
            page = await self._meta.request(ChunkRefs(after or ""))
            self._found.known.update(chunk.id for chunk, _ in page.chunks)
            self._found.chunks += len(page.chunks)
            self._found.bytes += sum(chunk.length * len(nodes) for chunk, nodes in page.chunks)
            await asyncio.gather(*(self._check(c, n) for c, nodes in page.chunks for n in nodes))
            for chunk, _ in page.chunks:
                if chunk.id in page.inline:
                    await self._check_kept(chunk, page.inline[chunk.id])
            for chunk_id, stripe in page.stripes.items():
                await self._check_stripe(chunk_id, stripe)
            after = page.after

    async def _check_stripe(self, chunk: str, stripe: Stripe) -> None:
        """Each piece of an erasure-coded chunk, on its node, as a copy is checked."""
        found = self._found
        found.known.update(p.id for p in stripe.pieces)
        found.bytes += sum(p.length for p, n in zip(stripe.pieces, stripe.nodes, strict=True) if n)
        for index, node in enumerate(stripe.nodes):
            if not node:
                why = f"piece {index} of chunk {chunk} is on no node (repair makes it again)"
                users = await self._users(chunk)
                piece = stripe.pieces[index].id
                found.problems.append(ChunkProblem("missing", piece, "", users, why))
        held = zip(stripe.pieces, stripe.nodes, strict=True)
        await asyncio.gather(*(self._check(piece, node, chunk) for piece, node in held if node))

    async def _check(self, chunk: ChunkRef, node: str, whose: str = "") -> None:
        """One copy of a chunk (or, with ``whose``, a piece of that chunk) read and hashed;
        one on an unreachable node counted, unchecked."""
        if node in self._found.unreachable:
            why, unchecked = self._found.unreachable[node]
            self._found.unreachable[node] = (why, unchecked + 1)
            return
        async with self._slots:
            buffer = self._pool.get(chunk.length)
            try:
                with memoryview(buffer) as view:
                    await self._verify(chunk, node, view[: chunk.length])
            except (IntegrityError, NotFound) as exc:
                kind: Literal["missing", "corrupt"] = (
                    "missing" if isinstance(exc, NotFound) else "corrupt"
                )
                await self._damaged(chunk, node, kind, exc.message, whose)
            except (Unavailable, Timeout) as exc:
                self._unreachable(node, f"not answering ({exc.message})")
                await self._check(chunk, node, whose)  # counted unchecked
            finally:
                self._pool.put(buffer)
            if self._progress:
                self._progress(chunk.length)

    async def _verify(self, chunk: ChunkRef, node: str, view: memoryview) -> None:
        """Read a copy (the transport checks its crc32c) and check it hashes to its id."""
        await self._chunks.read(node, chunk, view)
        loop = asyncio.get_running_loop()
        actual = await loop.run_in_executor(self._hasher, content_id, view)
        if actual != chunk.id:
            raise IntegrityError(
                f"chunk {chunk.id} is corrupt: its bytes hash (blake3) to {actual}, not to its "
                "id, though their crc32c matches (forged, or damaged past what crc32c sees)"
            )

    async def _check_kept(self, chunk: ChunkRef, data: bytes) -> None:
        """A chunk the metadata engine keeps: its bytes must match its crc32c and id."""
        self._found.bytes += len(data)
        same = len(data) == chunk.length and crc32c(data) == chunk.crc32c
        if same and content_id(memoryview(data)) == chunk.id:
            return
        users = await self._users(chunk.id)
        why = f"the bytes the metadata engine keeps for chunk {chunk.id} do not match it"
        self._found.problems.append(ChunkProblem("corrupt", chunk.id, "engine", users, why))

    async def _damaged(
        self,
        chunk: ChunkRef,
        node: str,
        kind: Literal["missing", "corrupt"],
        why: str,
        whose: str = "",
    ) -> None:
        if self._report is not None:  # a cluster repairs what fsck finds
            await self._report(chunk.id, node, why)
        users = await self._users(whose or chunk.id)
        if whose:
            why = f"a piece of chunk {whose}: {why}"
        where = f"{node}:{self._chunks.describe(node, chunk.id)}"
        self._found.problems.append(ChunkProblem(kind, chunk.id, where, users, why))

    async def _users(self, chunk: str) -> tuple[str, ...]:
        paths: list[str] = []
        after = 0
        while page := await self._meta.request(ChunkUsers(chunk, after)):
            paths.extend(path for _, path in page if path)
            after = page[-1][0]
        return tuple(sorted(paths))

    async def _check_metadata(self) -> list[ChunkProblem]:
        found = await self._meta.request(CheckMetadata())
        self._found.problems.extend(found)
        # An extent's chunk stays live even when its own row is what was damaged.
        self._found.known.update(p.chunk for p in found if p.chunk)
        return found

    # -- the nodes' files ----------------------------------------------------------

    async def _find_orphans(self, node: str) -> None:
        after = ""
        while page := await self._chunks.inventory(node, self._store, after):
            self._found.held += len(page)
            for chunk_id, mtime in page:
                if chunk_id not in self._found.known:
                    self._orphan(node, chunk_id, mtime)
            after = page[-1][0]

    def _orphan(self, node: str, chunk_id: str, mtime: float) -> None:
        where = f"{node}:{self._chunks.describe(node, chunk_id)}"
        detail = "no metadata names this chunk file"
        self._found.problems.append(ChunkProblem("orphan", chunk_id, where, (), detail))
        self._found.orphans.append((node, chunk_id, mtime))

    async def _find_temporaries(self, node: str, quiet_since: float) -> None:
        after = ""
        while page := await self._chunks.temporaries(node, self._store, after):
            for name, size, mtime in page:
                if mtime < quiet_since:
                    where = f"{node}:{self._chunks.describe_temporary(node, name)}"
                    age = time.time() - mtime
                    detail = f"{size} bytes, last written {age:.0f} s ago: a writer's leftover"
                    self._found.problems.append(ChunkProblem("temporary", name, where, (), detail))
            after = page[-1][0]

    # -- collection ---------------------------------------------------------------------

    def _may_collect(
        self, inconsistent: list[ChunkProblem], cutoff: float, force: bool, adopted: list[str]
    ) -> None:
        """Refuse to delete anything when the metadata cannot be trusted, or cannot be
        shown to be the chunks' own (unless ``force``)."""
        if force:
            return
        unproven = [
            (n, c) for n, c, mtime in self._found.orphans if n in adopted and mtime < cutoff
        ]
        if unproven:
            raise IntegrityError(
                f"refusing to collect: {len(unproven)} chunk file(s) that no metadata names "
                "are where store-id was missing and was taken from this metadata over chunk "
                f"files already there (first: {self._chunks.describe(*unproven[0])}): nothing "
                "shows they belong to this database. If it is the store's own, --force "
                "deletes them and vouches for the rest"
            )
        if inconsistent:
            raise IntegrityError(
                f"refusing to collect: the metadata is inconsistent ({len(inconsistent)} "
                f"problem(s), first: {inconsistent[0].detail}); collecting now could delete "
                "live chunks (--force deletes anyway)"
            )
        doomed = sum(1 for _, _, mtime in self._found.orphans if self._unexplained(mtime, cutoff))
        held = self._found.held
        if too_many_orphans(doomed, held):
            raise IntegrityError(
                f"refusing to collect: {doomed} of {held} chunk files on the nodes "
                f"({doomed / held:.0%}) are named by no metadata: is this the store's right "
                "metadata database, restored whole? (--force deletes them anyway)"
            )

    def _unexplained(self, mtime: float, cutoff: float) -> bool:
        """Whether an orphan that collection would delete is not explained by a restore:
        a chunk file written after the backup the metadata came from is no metadata's,
        as expected, however many there are."""
        return mtime < cutoff and not (self._restored and mtime >= self._restored)

    async def _collect(self, nodes: tuple[str, ...], grace: float, cutoff: float) -> int:
        """Delete old orphan copies, forget long-unreferenced chunks and delete their
        copies, then remove old temporaries; how many went."""
        orphans = [(node, chunk) for node, chunk, mtime in self._found.orphans if mtime < cutoff]
        gone = await self._delete(orphans, cutoff)
        while page := await self._meta.request(Collectable(grace)):
            copies = [(n, c, min(cutoff, since)) for c, held, since in page for n in held]
            gone += await self._delete_each(copies)
        for node in nodes:
            count, _ = await self._chunks.clean(node, self._store, cutoff)
            gone += count
        return gone

    async def _delete(self, copies: Iterable[tuple[str, str]], cutoff: float) -> int:
        """Delete copies a page at a time; one that cannot be reached stays, an orphan."""
        return await self._delete_each([(n, c, cutoff) for n, c in copies])

    async def _delete_each(self, copies: list[tuple[str, str, float]]) -> int:
        """``_delete`` with a cutoff of each copy's own: (node, chunk, cutoff);
        none on a node found unreachable (it stays, an orphan)."""
        pending = [(n, c, cut) for n, c, cut in copies if n not in self._found.unreachable]
        gone = 0
        for start in range(0, len(pending), 500):
            outcomes = await asyncio.gather(
                *(self._chunks.delete(n, c, cut) for n, c, cut in pending[start : start + 500]),
                return_exceptions=True,
            )
            for outcome in outcomes:
                if isinstance(outcome, BaseException) and not isinstance(outcome, GrabenError):
                    raise outcome
            gone += sum(o is True for o in outcomes)
        return gone
