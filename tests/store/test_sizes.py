"""parse_size: sizes as people write them, for every command's size options."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from graben.store import InvalidArgument, parse_size


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4096", 4096),
        ("0", 0),
        ("512K", 512 << 10),
        ("512k", 512 << 10),
        ("256MiB", 256 << 20),
        ("256MB", 256 << 20),
        ("256 M", 256 << 20),
        ("50G", 50 << 30),
        ("1.5M", 1536 << 10),
        ("2T", 2 << 40),
        ("1PiB", 1 << 50),
        ("100B", 100),
        (" 7G ", 7 << 30),
    ],
)
def test_sizes_in_binary_units(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(
    "text", ["", "G", "fifty", "10X", "-5", "5 GiBs", "1e9", "10iB", "5 G B", "1.5.5G"]
)
def test_a_size_that_is_not_one_is_refused_naming_it(text: str) -> None:
    with pytest.raises(InvalidArgument, match="not a size"):
        parse_size(text)


def test_a_refusal_is_also_a_value_error_for_argparse() -> None:
    with pytest.raises(ValueError, match="lots"):
        parse_size("lots")


@given(st.integers(min_value=0, max_value=1 << 60))
def test_a_plain_count_is_itself(size: int) -> None:
    assert parse_size(str(size)) == size
    assert parse_size(size) == size
