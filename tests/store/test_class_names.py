"""Storage class names: what parses, what it means, and the one canonical form."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from graben.store import InvalidArgument
from graben.store._classes import MAX_PIECES, StorageClass, parse


@pytest.mark.parametrize(
    ("text", "kind", "k", "m", "after", "name"),
    [
        ("ec:6+3", "ec", 6, 3, 0, "ec:6+3"),
        ("ec:2+1@0", "ec", 2, 1, 0, "ec:2+1"),
        (" ec:10+4@90m ", "ec", 10, 4, 5400, "ec:10+4@90m"),
        ("ec:6+3@3600", "ec", 6, 3, 3600, "ec:6+3@1h"),
        ("ec:6+3@2d", "ec", 6, 3, 172800, "ec:6+3@2d"),
        ("ec:4+2@61s", "ec", 4, 2, 61, "ec:4+2@61s"),
        ("replicated", "replicated", 0, 0, 0, "replicated"),
        ("s3@7d", "s3", 0, 0, 604800, "s3@7d"),
    ],
)
def test_a_class_parses_to_its_shape_and_canonical_name(
    text: str, kind: str, k: int, m: int, after: int, name: str
) -> None:
    found = parse(text)
    assert (found.kind, found.k, found.m, found.after_s) == (kind, k, m, after)
    assert found.name == name
    assert parse(found.name) == found


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("ec:6", "expected ec:K+M, s3 or replicated"),
        ("raid6", "expected ec:K+M"),
        ("ec:0+3", "K >= 1"),
        ("ec:6+0", "M >= 1"),
        (f"ec:{MAX_PIECES}+1", f"K + M <= {MAX_PIECES}"),
        ("ec:6+3@soon", "a number with s, m, h or d"),
        ("ec:6+3@1w", "a number with s, m, h or d"),
        ("replicated:3", "expected ec:K+M, s3 or replicated"),
        ("", "unknown storage class"),
    ],
)
def test_a_wrong_class_is_refused_saying_why(text: str, says: str) -> None:
    with pytest.raises(InvalidArgument, match=says.replace("+", r"\+")):
        parse(text)


@given(
    st.integers(1, 20),
    st.integers(1, 12),
    st.integers(0, 10**7),
)
def test_every_canonical_name_parses_back_to_the_same_class(k: int, m: int, after: int) -> None:
    if k + m > MAX_PIECES:
        return
    made = StorageClass("ec", k=k, m=m, after_s=after)
    assert parse(made.name) == made
