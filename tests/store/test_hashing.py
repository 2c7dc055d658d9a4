"""Checksums: crc32c_combine must agree with checksumming the joined bytes."""

from __future__ import annotations

import os

from hypothesis import given
from hypothesis import strategies as st

from graben.store._hashing import crc32c, crc32c_combine


@given(st.binary(max_size=2000), st.binary(max_size=2000))
def test_combine_equals_crc_of_concatenation(a: bytes, b: bytes) -> None:
    assert crc32c_combine(crc32c(a), crc32c(b), len(b)) == crc32c(a + b)


def test_combine_on_large_pieces() -> None:
    a, b = os.urandom(3 << 20), os.urandom((2 << 20) + 7)
    assert crc32c_combine(crc32c(a), crc32c(b), len(b)) == crc32c(a + b)
