"""Stripes: a chunk as K data pieces and M parity pieces (Reed-Solomon, zfec).

A chunk of L bytes is cut into K pieces of ``P = ceil(L / K)`` bytes (the
last padded with zeros); M parity pieces of P bytes are computed from them.
Any K of the K + M pieces give the chunk back. The code is systematic: the
data pieces are the chunk's own bytes, so a read of a healthy stripe fetches
them straight into the caller's buffer and decodes nothing; only a read that
lost a data piece decodes. Each piece is stored on its node as a chunk of its
own (content-addressed, crc32c checked on every read, blake3 by scrub).

zfec rather than pyeclib: measured on this machine, 6+3 over 8 MiB chunks,
zfec encoded at 0.64 GB/s on one thread and 0.90 on two (it lets go of the
GIL), pyeclib's ISA-L backend at 0.46 and 0.54; zfec's pieces are raw bytes,
where pyeclib's carry an 80-byte header that a direct read would have to skip.

Pure: no I/O; the arithmetic runs in zfec's C code without the GIL.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Mapping, Sequence

import zfec

Buffer = bytes | bytearray | memoryview


def piece_length(length: int, k: int) -> int:
    """Bytes in each piece of a ``length``-byte chunk cut in ``k``."""
    return -(-length // k)


def cut(data: memoryview, k: int) -> list[Buffer]:
    """The ``k`` data pieces of ``data``: views of it, padded copies of those that reach
    past its end (the last; more when the chunk is shorter than K bytes or so)."""
    size = piece_length(data.nbytes, k)
    pieces: list[Buffer] = []
    for i in range(k):
        piece = data[i * size : (i + 1) * size]
        if piece.nbytes < size:
            padded = bytearray(size)
            padded[: piece.nbytes] = piece
            piece = memoryview(padded)
        pieces.append(piece)
    return pieces


def encode(data: memoryview, k: int, m: int) -> list[Buffer]:
    """All ``k + m`` pieces of ``data``, data pieces first (views of ``data``)."""
    pieces = cut(data, k)
    parity = _encoder(k, k + m).encode(tuple(pieces), tuple(range(k, k + m)))
    return [*pieces, *parity]


def decode(
    have: Mapping[int, Buffer], k: int, m: int, into: memoryview, columns: slice = slice(None)
) -> None:
    """Fill ``into`` (the whole chunk) from any ``k`` pieces, by index; or, given
    ``columns`` (byte positions within each piece), that part of each data piece only.

    Each byte position of a stripe is a code of its own, so ranges of columns decode
    independently: two threads decoding halves take half the time. A data piece that
    is already in its place in ``into`` is not copied again."""
    size = piece_length(into.nbytes, k)
    lo, hi, _ = columns.indices(size)
    cut = {i: memoryview(piece)[lo:hi] for i, piece in have.items()}
    data = _data_pieces(cut, k, m)
    for i, piece in enumerate(data):
        start = i * size + lo
        part = into[start : min(i * size + hi, into.nbytes)]
        if part.nbytes and not _same(piece, part):
            part[:] = memoryview(piece)[: part.nbytes]


def _same(piece: Buffer, part: memoryview) -> bool:
    """Whether ``piece`` is a view of exactly the memory ``part`` covers."""
    if not isinstance(piece, memoryview) or piece.readonly or part.readonly:
        return False
    return piece.nbytes >= part.nbytes and _address(piece) == _address(part)


def _address(view: memoryview) -> int:
    """Where a (contiguous, writable, not empty) view's memory starts."""
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def rebuild(have: Mapping[int, Buffer], k: int, m: int, want: Sequence[int]) -> dict[int, Buffer]:
    """The pieces ``want`` names (by index), made again from any ``k`` others."""
    data = _data_pieces(have, k, m)
    parity = [i for i in want if i >= k]
    made = dict(zip(parity, _encoder(k, k + m).encode(tuple(data), tuple(parity)), strict=True))
    return {i: data[i] if i < k else made[i] for i in want}


def _data_pieces(have: Mapping[int, Buffer], k: int, m: int) -> list[Buffer]:
    """The ``k`` data pieces, decoded only if one of them is missing."""
    if len(have) < k:
        raise ValueError(f"{len(have)} pieces of a {k}+{m} stripe: at least {k} are needed")
    if all(i in have for i in range(k)):
        return [have[i] for i in range(k)]
    # Data pieces first: each one used is one fewer row of the matrix to invert.
    chosen = sorted(have)[:k]
    got = _decoder(k, k + m).decode(tuple(have[i] for i in chosen), tuple(chosen))
    return list(got)


@functools.cache
def _encoder(k: int, n: int) -> zfec.Encoder:
    return zfec.Encoder(k, n)


@functools.cache
def _decoder(k: int, n: int) -> zfec.Decoder:
    return zfec.Decoder(k, n)
