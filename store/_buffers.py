"""Reusable, page-aligned chunk buffers.

Copying into freshly allocated memory runs at 1-1.5 GB/s here (page faults)
against ~18 GB/s into memory already touched, and page-cache reads into a
buffer that is not page-aligned run 4.5x slower: so chunk buffers come from
``mmap`` and go back to a pool instead of being allocated per chunk.

A caller's buffer handed to a worker thread must also be let go of when the
call returns: ``loop.run_in_executor(pool, fn, *args)`` keeps ``args`` in the
executor's work item until the worker thread gets past it, which can be after
the awaiting coroutine has resumed and its caller has returned; a slice of a
mapped file given there is then still exported when the caller closes the
map (``BufferError``). ``in_thread`` drops them in the worker first.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import mmap
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from functools import partial
from typing import Any, Generic, TypeVar

R = TypeVar("R")


class BufferPool:
    """A thread-safe free list of ``size``-byte mmap buffers, keeping at most ``keep``."""

    def __init__(self, size: int, keep: int = 16) -> None:
        self.size = size
        self._keep = keep
        self._free: list[mmap.mmap] = []
        self._lock = threading.Lock()
        self.taken = 0
        """Buffers handed out so far (a caller that trims when idle watches it)."""

    @property
    def kept(self) -> int:
        """Buffers held for reuse now."""
        return len(self._free)

    def get(self, size: int = 0) -> mmap.mmap:
        """A buffer of at least ``size`` bytes (default: the pool's size); ``put`` it back."""
        self.taken += 1
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
        self.trim()

    def trim(self) -> None:
        """Unmap the buffers held for reuse (the pool stays usable: a long-lived process
        gives their memory back while idle)."""
        with self._lock:
            free, self._free = self._free, []
        for buffer in free:
            _unmap(buffer)


def _unmap(buffer: mmap.mmap) -> None:
    # A view may still be alive somewhere; then the mapping goes with it.
    with contextlib.suppress(BufferError):
        buffer.close()


# -- bytes filled in place ------------------------------------------------------
#
# ``get`` returns ``bytes``; building them in a bytearray and copying costs a
# second pass over fresh memory (0.29 against 0.92 GB/s for 512 MiB here).
# CPython's C API allows filling a new bytes object before anyone else sees it
# (``PyBytes_FromStringAndSize(NULL, n)``); with huge pages advised for the
# span the first touch runs at ~2.3 GB/s.

_HUGE_PAGE = 2 * 1024 * 1024
_MADV_HUGEPAGE = 14
_FILL_IN_PLACE_MIN = 4 * _HUGE_PAGE
"""Smaller results are built the plain way: the saving is not worth the ctypes calls."""


def _c_api() -> tuple[Any, Any, Any] | None:
    try:
        new = ctypes.pythonapi.PyBytes_FromStringAndSize
        new.restype, new.argtypes = ctypes.py_object, (ctypes.c_void_p, ctypes.c_ssize_t)
        address = ctypes.pythonapi.PyBytes_AsString
        address.restype, address.argtypes = ctypes.c_void_p, (ctypes.py_object,)
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
        madvise.restype = ctypes.c_int
        madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    except (AttributeError, OSError):  # not CPython, or no madvise
        return None
    return new, address, madvise


_API = _c_api()


def writable_bytes(size: int) -> tuple[bytes | bytearray, memoryview]:
    """A new object of ``size`` bytes and a writable view of it.

    Large ones are ``bytes`` filled in place: fill all of the view, release
    it, and only then share the bytes. Elsewhere a ``bytearray``, for the
    caller to turn into bytes.
    """
    if _API is None or size < _FILL_IN_PLACE_MIN:
        out = bytearray(size)
        return out, memoryview(out)
    new, address, madvise = _API
    result: bytes = new(None, size)
    start = address(result)
    lo = -(-start // _HUGE_PAGE) * _HUGE_PAGE
    hi = (start + size) // _HUGE_PAGE * _HUGE_PAGE
    if hi > lo:
        madvise(lo, hi - lo, _MADV_HUGEPAGE)  # advice only: failure changes nothing
    return result, memoryview((ctypes.c_char * size).from_address(start)).cast("B")


# -- streaming between files ----------------------------------------------------

ReadInto = Callable[[memoryview], "int | None"]
Write = Callable[[memoryview], object]
Tick = Callable[[int], object]
"""A progress callback: bytes just moved."""


@contextlib.contextmanager
def transfer_buffer(size: int) -> Iterator[memoryview]:
    """One transfer buffer, page-aligned (an mmap) and reused for every block."""
    buffer = mmap.mmap(-1, size)
    view = memoryview(buffer)
    try:
        yield view
    finally:
        view.release()
        with contextlib.suppress(BufferError):  # a traceback may still hold a slice of it
            buffer.close()


def pump(
    read_into: ReadInto, write: Write, block: memoryview, tick: Tick, limit: int | None = None
) -> int:
    """Copy from ``read_into`` to ``write`` through ``block``, up to ``limit`` bytes."""
    done = 0
    while limit is None or done < limit:
        want = block if limit is None else block[: min(block.nbytes, limit - done)]
        n = read_into(want)
        if not n:
            break
        write(block[:n])
        tick(n)
        done += n
    return done


class _Once(Generic[R]):
    """A call that forgets its function and arguments as it runs."""

    def __init__(self, call: Callable[[], R]) -> None:
        self._call: Callable[[], R] | None = call

    def __call__(self) -> R:
        call, self._call = self._call, None
        assert call is not None, "a call runs once"
        return call()


async def in_thread(executor: Executor | None, fn: Callable[..., R], *args: Any) -> R:
    """``fn(*args)`` on ``executor``; nothing of ``args`` is held once it returns."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(executor, _Once(partial(fn, *args)))
