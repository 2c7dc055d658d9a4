"""The write path: chunk-sized views in, one committed file out.

``Upload`` receives the file's bytes as chunk-sized views in order, hashes
and stores up to ``max_inflight`` of them at once (skipping chunks the store
already holds), and on ``commit`` makes the file visible in one metadata
transaction. Nothing is visible before the commit; a writer that dies leaves
only unreferenced chunk files, which collection removes after a grace period.

``Staging`` is the buffering in front of it for file objects: it copies
writes into pooled buffers and hands full ones on. ``WriteOptions`` is how
one file is written, gathered once from the keywords of ``put`` and
``put_parts``.
"""

from __future__ import annotations

import asyncio
import mmap
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass

import msgspec

from .._buffers import BufferPool, in_thread
from .._config import DEFAULT_REPLICA_DEADLINE
from .._errors import CannotPlace, GrabenError, IntegrityError, NoSpace, Timeout, Unavailable
from .._hashing import chunk_ref
from .._types import (
    Buffer,
    Change,
    ChunkRef,
    Extent,
    FileCommit,
    FileInfo,
    Receipt,
    StoredChunk,
    WriteMode,
)
from ..transport import ChunkTransport, Commit, MetaTransport, Placement, Prepare
from ._slow import SlowNodes

Release = Callable[[], None]
HASH_INLINE_MAX = 64 * 1024
"""Chunks up to this size are hashed on the event loop (~20 us), not in a thread."""
MAX_REPLACEMENTS = 3
"""Rounds of new placements for a chunk whose replica writes fail."""
_REPLACEABLE = (Unavailable, Timeout, NoSpace, IntegrityError)
"""Failures of one node that another node may not have."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteOptions:
    """How one file is written: the keywords of ``AsyncClient.put``, as one value."""

    exclusive: bool = False
    """Fail with ``AlreadyExists`` if the path exists at commit time."""
    replication: int | None = None
    """Copies of each chunk; ``None``: the client's options', then the store's default."""
    min_replicas: int | None = None
    """Copies the write needs while nodes are down; ``None``: the client's, then the store's."""
    permissions: int | None = None
    """Mode bits; ``None`` keeps those of the file replaced (0o644 if new)."""
    attributes: Change | None = None
    """An owner or a modification time to set as well."""

    @property
    def mode(self) -> WriteMode:
        """What the commit does to an existing file."""
        return "create" if self.exclusive else "overwrite"


DEFAULT_WRITE = WriteOptions()
"""Every keyword of ``put`` at its default."""


class Upload:
    """One file being written: ``add`` each chunk in order, then ``commit`` or ``abort``."""

    def __init__(
        self,
        meta: MetaTransport,
        chunks: ChunkTransport,
        hasher: Executor,
        path: str,
        *,
        mode: WriteMode,
        replication: int,
        max_inflight: int,
        permissions: int | None = None,
        attributes: Change | None = None,
        min_replicas: int = 0,
        inline_max: int = 0,
        slow: SlowNodes | None = None,
    ) -> None:
        self._meta, self._chunks, self._hasher = meta, chunks, hasher
        self._slow = slow or SlowNodes(DEFAULT_REPLICA_DEADLINE)
        self._inline_max = inline_max
        self._held: tuple[ChunkRef, bytes] | None = None
        """A first chunk small enough for the engine to keep, until the file proves longer."""
        self.path, self._mode, self._replication = path, mode, replication
        self._min_replicas = min_replicas  # 0: the store's
        self._attributes = attributes or Change()
        if permissions is not None:
            self._attributes = msgspec.structs.replace(self._attributes, mode=permissions)
        self._slots = asyncio.Semaphore(max_inflight)
        self._tasks: list[asyncio.Task[tuple[ChunkRef, StoredChunk | None]]] = []
        self._failure: Exception | None = None
        self._finished: FileCommit | None = None  # close() and a transaction's commit both ask
        self._offset = 0
        """The file's bytes before the next chunk (its quotas are asked about each)."""

    async def add(self, data: memoryview, release: Release | None = None) -> None:
        """Start storing the next chunk; waits while ``max_inflight`` are in flight.

        ``release`` is called once the bytes of ``data`` are no longer needed.
        A small first chunk is held back: if it turns out to be the whole file,
        the commit carries it and the engine keeps it (no node round trip).
        """
        if not self._tasks and self._held is None and 0 < data.nbytes <= self._inline_max:
            self._held = (chunk_ref(data), bytes(data))
            if release:
                release()
            return
        await self.spill()
        await self._start(data, release)

    async def _start(self, data: memoryview, release: Release | None) -> None:
        try:
            await self._slots.acquire()
        except BaseException:
            if release:
                release()
            raise
        if self._failure is not None:
            self._slots.release()
            if release:
                release()
            raise self._failure
        task = asyncio.create_task(self._store(data, release, self._offset))
        self._offset += data.nbytes
        task.add_done_callback(self._note_failure)
        self._tasks.append(task)

    def _note_failure(self, task: asyncio.Task[tuple[ChunkRef, StoredChunk | None]]) -> None:
        # Remembered as it happens, so ``add`` fails fast without scanning
        # every earlier chunk (a 1 TB file has 131,072 of them).
        if self._failure is None and not task.cancelled():
            exc = task.exception()
            if isinstance(exc, Exception):
                self._failure = exc

    async def spill(self) -> None:
        """Store a held-back first chunk on the nodes after all (the file goes on, or its
        commit carries too many bytes already)."""
        if self._held is None:
            return
        _, data = self._held
        self._held = None
        self._finished = None  # a finished commit carried it: it is made again without
        await self._start(memoryview(data), None)

    async def _store(
        self, data: memoryview, release: Release | None, offset: int
    ) -> tuple[ChunkRef, StoredChunk | None]:
        try:
            if data.nbytes <= HASH_INLINE_MAX:  # cheaper than the hop to a thread
                ref = chunk_ref(data)
            else:
                ref = await in_thread(self._hasher, chunk_ref, data)
            ask = Prepare(
                (ref,),
                self._replication,
                min_replicas=self._min_replicas,
                paths=(self.path,),
                sent=(offset,),
            )
            [placement] = await self._placed(ask)
            if not placement.upload:
                return ref, None
            return ref, await self._replicate(ref, data, placement.nodes, placement.minimum)
        finally:
            self._slots.release()
            if release:
                release()

    async def _placed(self, ask: Prepare) -> list[Placement]:
        """``ask``'s placement around the nodes this client saw fall behind, where the
        store can place the chunk without them (a hung node is waited for once per
        client, not once per chunk); else anywhere."""
        if avoid := self._slow.avoid():
            try:
                return await self._meta.request(msgspec.structs.replace(ask, avoid=avoid))
            except (CannotPlace, NoSpace):
                pass  # too few others: the slow ones after all
        return await self._meta.request(ask)

    async def _replicate(
        self, ref: ChunkRef, data: memoryview, nodes: tuple[str, ...], minimum: int
    ) -> StoredChunk:
        """Write to every node (fan-out); a node that fails, or falls behind the others
        (``SlowNodes``), is replaced by a new placement.

        With no node left to replace it, the chunk goes on with the copies it
        has if they are at least ``minimum`` (a degraded write: the commit
        records the copies it has, and repair adds the rest).
        """
        stored: list[str] = []
        failed: dict[str, GrabenError] = {}
        refusal: GrabenError | None = None
        receipts: dict[str, Receipt] = {}

        async def write(node: str) -> None:
            receipt = await self._chunks.write(node, ref, data)
            if receipt is not None:
                receipts[node] = receipt

        def done() -> StoredChunk:
            kept = tuple(receipts[n] for n in stored if n in receipts)
            return StoredChunk(ref, tuple(stored), receipts=kept)

        for _ in range(MAX_REPLACEMENTS + 1):
            trying = [n for n in nodes if not self._slow.slow(n)] or nodes  # none else: try
            results = await self._slow.each({n: write(n) for n in trying})
            for node in nodes:
                result = results.get(node, _passed_over(node))
                if result is None:
                    stored.append(node)
                elif isinstance(result, _REPLACEABLE):
                    failed[node] = result
                else:
                    raise result
            missing = len(nodes) - sum(results.get(n, False) is None for n in nodes)
            if not missing:
                return done()
            try:
                again = await self._replacements(
                    ref, missing, max(1, minimum - len(stored)), (*stored, *failed)
                )
            except (CannotPlace, NoSpace) as exc:
                refusal = exc  # nobody left to turn to
                break
            if again is None:  # another writer stored it with enough copies meanwhile
                return done()
            nodes = again
            if set(nodes) & set(failed):  # no other node to turn to (embedded: never)
                break
        if len(stored) >= minimum:
            return done()  # degraded: repair adds the rest
        raise _short(ref, stored, minimum, failed, refusal)

    async def _replacements(
        self, ref: ChunkRef, count: int, least: int, avoid: tuple[str, ...]
    ) -> tuple[str, ...] | None:
        [again] = await self._meta.request(Prepare((ref,), count, avoid, min_replicas=least))
        return again.nodes if again.upload else None  # None: stored enough meanwhile

    async def commit(self) -> FileInfo:
        """Wait for every chunk, then make the file visible atomically."""
        [info] = await self._meta.request(Commit((await self.finish(),)))
        return info

    async def finish(self) -> FileCommit:
        """Wait for every chunk; what a commit of the file sends (nothing visible yet).

        ``AsyncClient.commit_uploads`` commits several finished files at once.
        """
        if self._finished is not None:
            return self._finished
        if self._held is not None and not self._tasks:
            ref, data = self._held
            return self._finish([(ref, None)], [StoredChunk(ref, (), data)])
        try:
            results = await asyncio.gather(*self._tasks)
        except BaseException:
            await self.abort()
            raise
        stored = {new.chunk.id: new for _, new in results if new is not None}
        return self._finish(results, list(stored.values()))

    def _finish(
        self, results: list[tuple[ChunkRef, StoredChunk | None]], stored: list[StoredChunk]
    ) -> FileCommit:
        extents, offset = [], 0
        for ref, _ in results:
            extents.append(Extent(offset, ref.length, ref))
            offset += ref.length
        a = self._attributes
        self._finished = FileCommit(
            self.path,
            tuple(extents),
            tuple(stored),
            self._mode,
            self._replication,
            *(a.mode, a.uid, a.gid, a.mtime_ns),
        )
        return self._finished

    @property
    def inline_bytes(self) -> int:
        """Bytes its commit will carry for the engine to keep (0 or one small chunk)."""
        return 0 if self._held is None else len(self._held[1])

    async def abort(self) -> None:
        """Give up; nothing becomes visible.

        In-flight chunks are waited for, not cancelled: their worker threads
        still read the buffers, which must not be reused under them.
        """
        self._held = None
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()


def _passed_over(node: str) -> Unavailable:
    return Unavailable(f"data node {node} fell behind a write lately: passed over")


def _short(
    ref: ChunkRef,
    stored: list[str],
    minimum: int,
    failed: dict[str, GrabenError],
    refusal: GrabenError | None,
) -> GrabenError:
    """Why a chunk could not get its ``minimum`` copies: each failed node and its error."""
    why = "; ".join(f"{node}: {exc.message}" for node, exc in failed.items())
    last = refusal or list(failed.values())[-1]
    message = (
        f"chunk {ref.id} has {len(stored)} of the {minimum} copies a write needs; "
        f"failed nodes: {why}" + (f"; {refusal.message}" if refusal else "")
    )
    return type(last)(message, last.path)


class Staging:
    """Copies small writes into pooled chunk buffers; hands on full ones."""

    def __init__(self, pool: BufferPool) -> None:
        self._pool = pool
        self._buffer: mmap.mmap | None = None
        self._view: memoryview | None = None
        self._fill = 0

    def take(self, data: memoryview) -> int:
        """Copy as much of ``data`` as fits; returns how much was taken."""
        if self._view is None:
            self._buffer = self._pool.get()
            self._view = memoryview(self._buffer)
        n = min(data.nbytes, self._view.nbytes - self._fill)
        self._view[self._fill : self._fill + n] = data[:n]
        self._fill += n
        return n

    def feed(self, data: Buffer) -> Iterator[tuple[memoryview, Release]]:
        """Stage all of ``data``, yielding each chunk as it fills (hand each on before the next)."""
        with memoryview(data).cast("B") as view:
            taken = 0
            while taken < view.nbytes:
                taken += self.take(view[taken:])
                if self.full:
                    detached = self.detach()
                    assert detached is not None
                    yield detached

    @property
    def full(self) -> bool:
        """Whether the current buffer holds a whole chunk."""
        return self._view is not None and self._fill == self._view.nbytes

    def detach(self) -> tuple[memoryview, Release] | None:
        """Hand on what is staged (``None`` if nothing): its view and how to release it."""
        if self._view is None or self._buffer is None:
            return None
        view, buffer, fill = self._view, self._buffer, self._fill
        self._view = self._buffer = None
        self._fill = 0
        if fill == 0:
            view.release()
            self._pool.put(buffer)
            return None
        chunk = view[:fill]
        view.release()

        def release() -> None:
            chunk.release()
            self._pool.put(buffer)

        return chunk, release

    def discard(self) -> None:
        """Drop what is staged."""
        detached = self.detach()
        if detached is not None:
            detached[1]()
