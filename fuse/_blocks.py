"""Read-ahead for one open file: large blocks fetched off the loop, small reads served from them.

The kernel asks for 128 KiB at a time. A trip to a worker thread and through
the store client per request would cost more than the copy, so a handle reads
``BLOCK`` bytes at once in a worker thread and answers the kernel's requests
from memory on the loop. A reader going forward gets the next blocks fetched
while it reads this one. Memory is bounded: ``KEPT`` blocks per open file,
reused in turn.
"""

from __future__ import annotations

import mmap
import threading
from collections import OrderedDict
from collections.abc import Callable

import trio

BLOCK = 4 << 20
"""Bytes fetched at a time."""
AHEAD = 2
"""Blocks fetched ahead of a reader going forward."""
KEPT = AHEAD + 2
"""Blocks held per open file."""

Fetch = Callable[[int, memoryview], int]
"""Fill the buffer from the given offset of the file (blocking); bytes read."""


class _Block:
    def __init__(self, buffer: mmap.mmap) -> None:
        self.buffer = buffer
        self.length = 0
        self.ready = trio.Event()
        self.error: BaseException | None = None


class Blocks:
    """The blocks of one open file version of ``size`` bytes."""

    def __init__(self, fetch: Fetch, size: int, nursery: trio.Nursery) -> None:
        self._fetch, self._size, self._nursery = fetch, size, nursery
        self._blocks: OrderedDict[int, _Block] = OrderedDict()
        self._spare: list[mmap.mmap] = []
        self._lock = threading.Lock()  # one fetch at a time on the file object
        self._next = 0  # where a reader going forward asks next

    async def read(self, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes from ``offset`` (fewer only at the end of the file)."""
        end = min(offset + size, self._size)
        if offset >= end:
            return b""
        forward = offset == self._next
        self._next = end
        pieces = []
        pos = offset
        while pos < end:
            index = pos // BLOCK
            block = self._get(index)
            if forward:
                for ahead in range(index + 1, index + 1 + AHEAD):
                    if ahead * BLOCK < self._size:
                        self._get(ahead)
            await block.ready.wait()
            if block.error is not None:
                self._blocks.pop(index, None)
                raise block.error
            lo = pos - index * BLOCK
            hi = min(block.length, end - index * BLOCK)
            pieces.append(block.buffer[lo:hi])
            pos = index * BLOCK + hi
            if hi <= lo:
                break  # the file is shorter than it said
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

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
        block = _Block(self._spare.pop() if self._spare else mmap.mmap(-1, BLOCK))
        self._blocks[index] = block
        self._nursery.start_soon(self._load, index, block)
        return block

    async def _load(self, index: int, block: _Block) -> None:
        try:
            block.length = await trio.to_thread.run_sync(self._fill, index, block.buffer)
        except Exception as exc:  # handed to the reader that waits for this block
            block.error = exc
        finally:
            block.ready.set()

    def _fill(self, index: int, buffer: mmap.mmap) -> int:
        length = min(BLOCK, self._size - index * BLOCK)
        with self._lock, memoryview(buffer) as view:
            done = 0
            while done < length:
                n = self._fetch(index * BLOCK + done, view[done:length])
                if n <= 0:
                    break
                done += n
        return done
