"""Read-ahead for one open file: large blocks fetched off the loop, small reads served from them.

The kernel asks for 128 KiB to 1 MiB at a time. A trip through the store
client per request would cost more than the copy, so a handle reads a block
(the store's chunk size: whole chunks go straight into our buffer, without the
store's own staging copy) with the store's reader, on the loop (its fetches
and checksums do not hold it), and answers the kernel's requests from memory.
A reader going forward gets the next blocks fetched while it reads this one.
Memory is bounded: ``KEPT`` blocks per open file, reused in turn, none larger
than the file (a 2 KiB file costs a page, not a chunk).
"""

from __future__ import annotations

import asyncio
import mmap
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ._aio import Tasks

AHEAD = 2
"""Blocks fetched ahead of a reader going forward."""
KEPT = AHEAD + 2
"""Blocks held per open file."""

Fetch = Callable[[int, memoryview], Awaitable[int]]
"""Fill the buffer from the given offset of the file; bytes read (0 at its end)."""
PAGE = mmap.PAGESIZE


@dataclass(slots=True)
class ReadAheadCounts:
    """What the read-ahead blocks of every open file saw."""

    hits: int = 0
    """Kernel reads whose block was fetched (or being fetched) already."""
    misses: int = 0
    """Kernel reads that had to start fetching their block."""


class _Block:
    def __init__(self, buffer: mmap.mmap) -> None:
        self.buffer = buffer
        self.length = 0
        self.ready = asyncio.Event()
        self.error: BaseException | None = None


class Blocks:
    """The blocks of one open file version of ``size`` bytes."""

    def __init__(
        self,
        fetch: Fetch,
        size: int,
        block: int,
        nursery: Tasks,
        counts: ReadAheadCounts | None = None,
    ) -> None:
        self._fetch, self._size, self._nursery = fetch, size, nursery
        self._counts = counts or ReadAheadCounts()
        self._block = block
        self._buffer_size = max(PAGE, min(block, -(-size // PAGE) * PAGE))
        self._blocks: OrderedDict[int, _Block] = OrderedDict()
        self._spare: list[mmap.mmap] = []
        self._lock = asyncio.Lock()  # one fetch at a time on the store's reader
        self._sequential_offset = 0
        """Where a reader going forward asks next."""

    async def read(self, offset: int, size: int) -> bytes | memoryview:
        """Up to ``size`` bytes from ``offset`` (fewer only at the end of the file).

        A read within one block is a view of the block, not a copy: pyfuse3
        hands it to the kernel before the loop runs anything else, so the
        block cannot be refilled under it.
        """
        end = min(offset + size, self._size)
        if offset >= end:
            return b""
        forward = offset == self._sequential_offset
        self._sequential_offset = end
        pieces: list[memoryview] = []
        pos = offset
        while pos < end:
            index = pos // self._block
            found = self._blocks.get(index) is not None
            block = self._get(index)
            if found:
                self._counts.hits += 1
            else:
                self._counts.misses += 1
            if forward:
                for ahead in range(index + 1, index + 1 + AHEAD):
                    if ahead * self._block < self._size:
                        self._get(ahead)
            await block.ready.wait()
            if block.error is not None:
                self._blocks.pop(index, None)
                raise block.error
            lo = pos - index * self._block
            hi = min(block.length, end - index * self._block)
            pieces.append(memoryview(block.buffer)[lo:hi])
            pos = index * self._block + hi
            if hi <= lo:
                break  # the file is shorter than it said
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)  # joined: a copy

    def close(self) -> None:
        """Let go of the buffers (fetches still running finish into their own)."""
        self._blocks.clear()
        self._spare.clear()

    def _get(self, index: int) -> _Block:
        block = self._blocks.get(index)
        if block is not None:
            self._blocks.move_to_end(index)
            return block
        while len(self._blocks) >= KEPT:
            _, old = self._blocks.popitem(last=False)
            if old.ready.is_set():
                self._spare.append(old.buffer)
        block = _Block(self._spare.pop() if self._spare else mmap.mmap(-1, self._buffer_size))
        self._blocks[index] = block
        self._nursery.start_soon(self._load, index, block)
        return block

    async def _load(self, index: int, block: _Block) -> None:
        try:
            block.length = await self._fill(index, block.buffer)
        except Exception as exc:  # handed to the reader that waits for this block
            block.error = exc
        finally:
            block.ready.set()

    async def _fill(self, index: int, buffer: mmap.mmap) -> int:
        length = min(self._block, self._size - index * self._block)
        async with self._lock:
            with memoryview(buffer) as view:
                done = 0
                while done < length:
                    n = await self._fetch(index * self._block + done, view[done:length])
                    if n <= 0:
                        break
                    done += n
        return done
