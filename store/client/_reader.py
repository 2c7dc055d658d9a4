"""The read path: byte ranges of one committed file version.

A ``Reader`` holds a ``FileLayout`` (so it keeps reading the version it
opened even if the path is overwritten). Chunks are always read whole,
because the crc32c covers the whole chunk: straight into the caller's memory
when a request covers a chunk exactly (several such chunks in parallel; a
sync request for one whole chunk is served in the caller's thread when the
transport can read locally), else into a pooled buffer kept for the next
small reads. Sequential readers hint the transport ``read_ahead`` chunks
ahead, in batches, backing off while the hints find everything at hand; the
bytes come on their way without being copied twice (measured on 2 cores:
reading ahead into buffers of our own and copying out was slower than direct
reads). A replica that fails its checksum or cannot be read is skipped for
the next one. A chunk kept erasure-coded is read from its pieces (``_stripes``).
A chunk none of whose copies is where the layout says asks the metadata
service once where it is now (same file version): the leader may have moved
it to its storage class since the file was opened.
"""

from __future__ import annotations

import asyncio
import bisect
import mmap
from collections import OrderedDict
from collections.abc import Awaitable, Callable

import msgspec

from .._buffers import BufferPool, writable_bytes
from .._errors import GrabenError, IntegrityError, NotFound, Timeout, Unavailable
from .._hashing import crc32c
from .._types import ChunkRef, Extent, FileLayout
from ..transport import ChunkTransport
from ._slow import SlowNodes
from ._stripes import Striped

_RETRYABLE = (IntegrityError, NotFound, Unavailable, Timeout)
Report = Callable[[str, str, str], Awaitable[None]]
"""(chunk, node, reason): tell the store a copy is damaged."""
Relocate = Callable[[int], Awaitable[FileLayout]]
"""A page of the same file version's layout from an offset: where its chunks are now."""
CACHED_CHUNKS = 2
MAX_FETCHES = 4
"""Chunks one large read fetches at once. Reading 512 MiB of a cluster file in one
call ran at 0.5 GB/s with every chunk requested at once, 1.8 GB/s four at a time."""
MAX_HINT_SKIP = 64
"""Chunks a reader may go without hints while they keep being at hand already."""


class Reader:
    """Reads of one file version; one request at a time."""

    def __init__(
        self,
        chunks: ChunkTransport,
        pool: BufferPool,
        layout: FileLayout,
        read_ahead: int,
        report: Report | None = None,
        slow: SlowNodes | None = None,
        relocate: Relocate | None = None,
    ) -> None:
        self.layout = layout
        self._relocate = relocate
        self._slow = slow
        self._report = report
        self.size = layout.info.size
        self._chunks, self._pool = chunks, pool
        self._read_ahead = min(read_ahead, chunks.prefetch_window)
        self._starts = [x.offset for x in layout.extents]
        self._cache: OrderedDict[int, asyncio.Task[mmap.mmap]] = OrderedDict()
        self._hinted = -1
        self._hints: set[asyncio.Task[int]] = set()
        self._skip = 0
        self._reports: set[asyncio.Task[None]] = set()
        self._next_offset = 0
        self._striped = Striped(chunks, self._report_damage, self._failure, slow)
        self._lock = asyncio.Lock()
        self._loop = asyncio.get_running_loop()

    # -- public ------------------------------------------------------------

    async def readinto(self, offset: int, into: memoryview) -> int:
        """Fill ``into`` from ``offset``; returns bytes read (0 at end of file)."""
        async with self._lock:
            n = max(0, min(into.nbytes, self.size - offset))
            if n == 0:
                return 0
            jobs, last = self._plan(offset, into[:n])
            if offset == self._next_offset:
                self._hint(last + 1)
            if len(jobs) <= MAX_FETCHES:
                await asyncio.gather(*jobs)
            else:
                slots = asyncio.Semaphore(MAX_FETCHES)
                await asyncio.gather(*(_bounded(slots, job) for job in jobs))
            self._next_offset = offset + n
            return n

    async def read(self, offset: int, size: int) -> bytes:
        """Bytes ``[offset, offset + size)``, cut at the end of the file."""
        n = max(0, min(size, self.size - offset))
        out, view = writable_bytes(n)
        with view:
            await self.readinto(offset, view)
        return out if isinstance(out, bytes) else bytes(out)

    async def close(self) -> None:
        """Return cached buffers to the pool."""
        async with self._lock:
            while self._cache:
                self._evict(next(iter(self._cache)))

    # -- planning ------------------------------------------------------------

    def _plan(self, offset: int, into: memoryview) -> tuple[list[Awaitable[None]], int]:
        """One job per extent touched (a direct read or a copy); and the last extent."""
        jobs: list[Awaitable[None]] = []
        index = bisect.bisect_right(self._starts, offset) - 1
        pos, end = offset, offset + into.nbytes
        while pos < end:
            extent = self.layout.extents[index]
            lo, hi = pos - extent.offset, min(extent.length, end - extent.offset)
            dest = into[pos - offset : pos - offset + hi - lo]
            if lo == 0 and hi == extent.length and _whole(extent) and index not in self._cache:
                jobs.append(self._fetch(extent, dest))
            else:
                jobs.append(self._copy(index, lo, dest))
            pos += hi - lo
            index += 1
        return jobs, index - 1

    async def _copy(self, index: int, lo: int, dest: memoryview) -> None:
        buffer = await self._cached(index)
        start = self.layout.extents[index].chunk_offset + lo
        with memoryview(buffer) as view:
            dest[:] = view[start : start + dest.nbytes]

    def _cached(self, index: int) -> asyncio.Task[mmap.mmap]:
        task = self._cache.get(index)
        if task is None:
            task = asyncio.ensure_future(self._load(self.layout.extents[index]))
            self._cache[index] = task
            while len(self._cache) > CACHED_CHUNKS:
                self._evict(next(iter(self._cache)))
        self._cache.move_to_end(index)
        return task

    def _evict(self, index: int) -> None:
        task = self._cache.pop(index)

        def recycle(done: asyncio.Task[mmap.mmap]) -> None:
            if not done.cancelled() and done.exception() is None:
                self._pool.put(done.result())

        # A load still in flight has a worker thread writing its buffer:
        # recycle only once it is done.
        task.add_done_callback(recycle)

    def _hint(self, index: int) -> None:
        """Tell the transport about the next ``read_ahead`` chunks.

        Hints go out in batches, once half the window is used up: a hint per
        chunk cost a thread hop per chunk, which showed on warm reads.
        """
        if not self._hint_due(index):
            return
        stop = min(index + self._read_ahead, len(self.layout.extents))
        batches: dict[str, list[ChunkRef]] = {}
        for ahead in range(max(index, self._hinted + 1), stop):
            chunk = self.layout.extents[ahead].chunk
            nodes = self._replicas(chunk.id)
            if nodes:
                batches.setdefault(nodes[0], []).append(chunk)
            self._hinted = ahead
        for node, chunks in batches.items():
            task = asyncio.ensure_future(self._chunks.prefetch(node, chunks))
            self._hints.add(task)
            task.add_done_callback(self._hinted_done)

    def _hinted_done(self, task: asyncio.Task[int]) -> None:
        """Back off while the hints find everything at hand (warm data)."""
        self._hints.discard(task)
        if task.cancelled() or task.exception() is not None:
            return  # a failed hint is harmless; the read will report
        if task.result() == 0:
            self._skip = min(2 * self._skip or self._read_ahead, MAX_HINT_SKIP)
        else:
            self._skip = 0

    def _hint_due(self, index: int) -> bool:
        # Also asked from the sync fast path's thread: a stale answer only
        # costs one hint too many or one batch late.
        return self._read_ahead > 0 and self._hinted + self._skip - index < self._read_ahead // 2

    # -- fetching -----------------------------------------------------------

    async def _load(self, extent: Extent) -> mmap.mmap:
        buffer = self._pool.get(extent.chunk.length)
        try:
            with memoryview(buffer) as view:
                await self._fetch(extent, view[: extent.chunk.length])
        except BaseException:
            self._pool.put(buffer)
            raise
        return buffer

    async def _fetch(self, extent: Extent, into: memoryview) -> None:
        """Read the extent's whole chunk into ``into``, failing over between replicas; a
        chunk none of whose copies is where the layout said is looked up once more (the
        leader may have moved it to its class meanwhile) and read from there."""
        try:
            await self._fetch_from(extent, into)
        except IntegrityError:
            if not await self._moved(extent):
                raise
            await self._fetch_from(extent, into)

    async def _moved(self, extent: Extent) -> bool:
        """Whether the chunk of ``extent`` is kept elsewhere now than this layout says (the
        layout then says where)."""
        if self._relocate is None:
            return False
        try:
            page = await self._relocate(extent.offset)
        except NotFound:
            return False  # this version is gone: the first error stands
        chunk, old = extent.chunk.id, self.layout
        where = (page.replicas.get(chunk), page.stripes.get(chunk), page.inline.get(chunk))
        if where == (old.replicas.get(chunk), old.stripes.get(chunk), old.inline.get(chunk)):
            return False
        self.layout = msgspec.structs.replace(
            old,
            replicas={**old.replicas, **page.replicas},
            stripes={**old.stripes, **page.stripes},
            inline={**old.inline, **page.inline},
        )
        return True

    async def _fetch_from(self, extent: Extent, into: memoryview) -> None:
        if self._read_inline(extent.chunk, into):
            return
        stripe = self.layout.stripes.get(extent.chunk.id)
        if stripe is not None:
            await self._striped.fetch(extent, stripe, into)
            return
        chunk = extent.chunk
        errors: list[GrabenError] = []
        nodes = self._replicas(chunk.id)
        for i, node in enumerate(nodes):
            read = self._chunks.read(node, chunk, into)
            try:
                if self._slow is not None and i < len(nodes) - 1:  # another copy to ask
                    await self._slow.bounded(node, read, chunk.length)
                else:
                    await read
                return
            except _RETRYABLE as exc:
                errors.append(exc)
                if isinstance(exc, (IntegrityError, NotFound)):
                    self._report_damage(chunk.id, node, exc.message)
        raise self._failure(extent, errors)

    def _replicas(self, chunk: str) -> list[str]:
        """The nodes holding ``chunk``, in the order to ask them: one that fell
        behind a write lately last."""
        nodes = self.layout.replicas.get(chunk, ())
        return list(nodes) if self._slow is None else self._slow.order(nodes)

    def _read_inline(self, chunk: ChunkRef, into: memoryview) -> bool:
        """Fill ``into`` with a chunk the metadata engine keeps, checked; whether it is one."""
        data = self.layout.inline.get(chunk.id)
        if data is None:
            return False
        if len(data) != chunk.length or crc32c(data) != chunk.crc32c:
            raise IntegrityError(
                f"{self.layout.info.path}: the bytes the metadata engine keeps for chunk "
                f"{chunk.id} fail their checksum (run fsck)"
            )
        into[: chunk.length] = data
        return True

    def _report_damage(self, chunk: str, node: str, reason: str) -> None:
        """Report a damaged copy so it is repaired; the read does not wait for it."""
        if self._report is None:
            return
        task = asyncio.ensure_future(self._report(chunk, node, reason))
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)

    # -- the sync fast path ----------------------------------------------------

    def read_here(self, offset: int, into: memoryview) -> int | None:
        """Serve a sync read in the caller's thread, or return ``None`` to go async.

        Taken only when the transport can read locally and the request is one
        whole chunk: measured on 2 cores, the hops through the event loop and
        back cost ~40% of warm-read throughput. The caller must not run other
        reads of this reader concurrently (file objects serialise them).
        """
        read = self._chunks.local_read
        n = min(into.nbytes, self.size - offset)
        if (read is None and not self.layout.inline) or n <= 0:
            return None
        index = bisect.bisect_right(self._starts, offset) - 1
        extent = self.layout.extents[index]
        if extent.offset != offset or extent.length != n or not _whole(extent):
            return None
        if extent.chunk.id in self.layout.stripes:
            return None
        if index in self._cache:
            return None
        if self._read_inline(extent.chunk, into):
            self._next_offset = offset + n
            return n
        if read is None:
            return None
        if offset == self._next_offset and self._hint_due(index + 1):
            self._loop.call_soon_threadsafe(self._hint, index + 1)
        errors: list[GrabenError] = []
        for node in self._replicas(extent.chunk.id):
            try:
                read(node, extent.chunk, into[:n])
                break
            except _RETRYABLE as exc:
                errors.append(exc)
        else:
            raise self._failure(extent, errors)
        self._next_offset = offset + n
        return n

    def _failure(self, extent: Extent, errors: list[GrabenError]) -> GrabenError:
        """The one error to raise when no replica of a chunk could be read."""
        where = f"{self.layout.info.path} at offset {extent.offset}"
        if not errors:
            return IntegrityError(f"{where}: no replica of chunk {extent.chunk.id} is recorded")
        damaged = [e for e in errors if isinstance(e, (IntegrityError, NotFound))]
        if not damaged:  # every replica unreachable: say so, the data may be fine
            return type(errors[0])(f"{where}: {errors[0].message}", errors[0].path)
        # A chunk a committed file names is damaged or gone: that is an
        # integrity failure of the file, never "file not found".
        return IntegrityError(f"{where}: {damaged[0].message}", damaged[0].path)


def _whole(extent: Extent) -> bool:
    return extent.chunk_offset == 0 and extent.length == extent.chunk.length


async def _bounded(slots: asyncio.Semaphore, job: Awaitable[None]) -> None:
    async with slots:
        await job
