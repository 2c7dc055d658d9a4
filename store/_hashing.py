"""Checksums and content hashes, all releasing the GIL on large buffers.

``crc32c_combine`` joins the checksums of two adjacent pieces (zlib's
``crc32_combine`` for the Castagnoli polynomial), so a chunk can be read and
checked in pieces on several threads and still be verified against the one
crc32c the metadata holds.
"""

from __future__ import annotations

import functools

import blake3
import crc32c as _crc32c

from ._types import Buffer, ChunkRef

_POLY = 0x82F63B78  # Castagnoli, reflected
_RELEASE_GIL_FROM = 64 * 1024


def crc32c(data: Buffer, value: int = 0) -> int:
    """crc32c of a buffer, continuing from ``value`` (hardware-accelerated).

    The library's default keeps the GIL here; releasing it explicitly lets
    two threads checksum at twice the speed.
    """
    mode = 1 if memoryview(data).nbytes >= _RELEASE_GIL_FROM else 0
    result: int = _crc32c.crc32c(data, value, gil_release_mode=mode)
    return result


def chunk_ref(data: Buffer) -> ChunkRef:
    """Hash a chunk: its blake3 id, length and crc32c."""
    view = memoryview(data).cast("B")
    return ChunkRef(blake3.blake3(view).hexdigest(), view.nbytes, crc32c(view))


def content_id(data: memoryview) -> str:
    """The blake3 id of a chunk's bytes, on the calling thread (the GIL is released).

    One thread hashes ~9 GB/s here, blake3's own thread pool no faster (8.5):
    an 8 MiB chunk costs ~1 ms beside its ~20 ms of durable write, and the
    node's write throughput measured the same with and without the check.
    Never blake3's pool (``max_threads``): it is Rayon's, and a process forked
    after it started (a DataLoader worker) hangs on its first hash.
    """
    return str(blake3.blake3(data).hexdigest())


def _multiply(a: int, b: int) -> int:
    """a * b modulo the polynomial (both as reflected bit strings)."""
    m, product = 1 << 31, 0
    while True:
        if a & m:
            product ^= b
            if not a & (m - 1):
                return product
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _powers() -> tuple[int, ...]:
    """x^(2^k) modulo the polynomial, for k in 0..31."""
    table, power = [], 1 << 30  # x^1
    for _ in range(32):
        table.append(power)
        power = _multiply(power, power)
    return tuple(table)


_X2N = _powers()


@functools.lru_cache(maxsize=64)
def _shift(length: int) -> int:
    """x^(8 * length) modulo the polynomial: appending ``length`` zero bytes."""
    result, k, n = 1 << 31, 3, length
    while n:
        if n & 1:
            result = _multiply(_X2N[k & 31], result)
        n >>= 1
        k += 1
    return result


def crc32c_combine(first: int, second: int, second_length: int) -> int:
    """crc32c of ``A + B`` from crc32c(A), crc32c(B) and len(B)."""
    return _multiply(_shift(second_length), first) ^ second
