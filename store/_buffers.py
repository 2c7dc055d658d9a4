"""Reusable, page-aligned chunk buffers.

Copying into freshly allocated memory runs at 1-1.5 GB/s here (page faults)
against ~18 GB/s into memory already touched, and page-cache reads into a
buffer that is not page-aligned run 4.5x slower: so chunk buffers come from
``mmap`` and go back to a pool instead of being allocated per chunk.
"""

from __future__ import annotations

import contextlib
import mmap
import threading


class BufferPool:
    """A thread-safe free list of ``size``-byte mmap buffers, keeping at most ``keep``."""

    def __init__(self, size: int, keep: int = 16) -> None:
        self.size = size
        self._keep = keep
        self._free: list[mmap.mmap] = []
        self._lock = threading.Lock()

    def get(self, size: int = 0) -> mmap.mmap:
        """A buffer of at least ``size`` bytes (default: the pool's size); ``put`` it back."""
        if size > self.size:
            return mmap.mmap(-1, size)
        with self._lock:
            if self._free:
                return self._free.pop()
        return mmap.mmap(-1, self.size)

    def put(self, buffer: mmap.mmap) -> None:
        """Return a buffer; no view of it may outlive this call."""
        with self._lock:
            if len(self._free) < self._keep and len(buffer) == self.size:
                self._free.append(buffer)
                return
        _unmap(buffer)

    def close(self) -> None:
        """Unmap every pooled buffer."""
        with self._lock:
            free, self._free = self._free, []
        for buffer in free:
            _unmap(buffer)


def _unmap(buffer: mmap.mmap) -> None:
    # A view may still be alive somewhere; then the mapping goes with it.
    with contextlib.suppress(BufferError):
        buffer.close()
