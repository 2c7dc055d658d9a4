"""Stripes: any K of K + M pieces give a chunk back, and the data pieces are its bytes."""

from __future__ import annotations

import itertools
import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graben.store._classes import erasure


@pytest.mark.parametrize("length", [1, 5, 6, 4095, 1 << 20, (1 << 20) + 7])
def test_the_data_pieces_are_the_chunk_cut_in_k_and_padded(length: int) -> None:
    data = os.urandom(length)
    pieces = erasure.encode(memoryview(data), 6, 3)
    size = erasure.piece_length(length, 6)
    assert len(pieces) == 9 and {len(p) for p in pieces} == {size}
    assert b"".join(bytes(p) for p in pieces[:6]) == data + bytes(6 * size - length)


def test_every_choice_of_six_pieces_of_nine_gives_the_chunk_back() -> None:
    data = os.urandom(100_003)
    pieces = erasure.encode(memoryview(data), 6, 3)
    for chosen in itertools.combinations(range(9), 6):
        into = bytearray(len(data))
        erasure.decode({i: pieces[i] for i in chosen}, 6, 3, memoryview(into))
        assert into == data, chosen


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 8),
    st.integers(1, 4),
    st.binary(min_size=1, max_size=5000),
    st.randoms(use_true_random=False),
)
def test_lost_pieces_are_made_again_byte_for_byte(
    k: int, m: int, data: bytes, rnd: random.Random
) -> None:
    pieces = [bytes(p) for p in erasure.encode(memoryview(data), k, m)]
    lost = rnd.sample(range(k + m), rnd.randint(1, m))
    have = {i: pieces[i] for i in range(k + m) if i not in lost}
    made = erasure.rebuild(have, k, m, lost)
    assert {i: bytes(made[i]) for i in lost} == {i: pieces[i] for i in lost}
    into = bytearray(len(data))
    erasure.decode(have, k, m, memoryview(into))
    assert into == data


def test_fewer_than_k_pieces_is_an_error_not_wrong_bytes() -> None:
    pieces = erasure.encode(memoryview(os.urandom(600)), 6, 3)
    with pytest.raises(ValueError, match="at least 6 are needed"):
        erasure.decode({i: pieces[i] for i in range(5)}, 6, 3, memoryview(bytearray(600)))


def test_halves_of_the_columns_decode_alone_into_the_pieces_already_in_place() -> None:
    data = os.urandom(6 * 1000 + 5)
    pieces = erasure.encode(memoryview(data), 6, 3)
    into = bytearray(len(data))
    size = erasure.piece_length(len(data), 6)
    # Data pieces 0, 2 and 3 read straight into place, as a reader does; 1, 4, 5 lost.
    have: dict[int, erasure.Buffer] = {}
    for i in (0, 2, 3):
        into[i * size : (i + 1) * size] = pieces[i]
        have[i] = memoryview(into)[i * size : (i + 1) * size]
    have.update({i: pieces[i] for i in (6, 7, 8)})
    half = size // 2
    erasure.decode(have, 6, 3, memoryview(into), slice(0, half))
    assert (
        into[:half] == data[:half]
        and into[5 * size : 5 * size + half] == data[5 * size : 5 * size + half]
    )
    erasure.decode(have, 6, 3, memoryview(into), slice(half, size))
    assert into == data
