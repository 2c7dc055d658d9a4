"""Hostile and odd paths: clear errors, nothing escapes the store, nothing lost."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from graben.store import Client, InvalidPath, normalize_path


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("a/b", "/a/b"),
        ("/a//b/", "/a/b"),
        ("./a/./b", "/a/b"),
        ("/a/x/../b", "/a/b"),
        ("", "/"),
        ("/", "/"),
        ("/ünï cödé/名前", "/ünï cödé/名前"),
        ("/with\\backslash and\nnewline", "/with\\backslash and\nnewline"),
    ],
)
def test_normalize(raw: str, clean: str) -> None:
    assert normalize_path(raw) == clean


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("../etc/passwd", "climbs above the root"),
        ("/a/../../etc", "climbs above the root"),
        ("/a\x00b", "NUL"),
        ("/" + "x" * 256, "longer than 255"),
        ("/a" * 32_800, "longer than 65536"),
        ("/\udcff", "UTF-8"),
    ],
)
def test_hostile_paths_are_refused_with_a_reason(client: Client, raw: str, why: str) -> None:
    with pytest.raises(InvalidPath, match=why):
        normalize_path(raw)
    for call in (
        lambda: client.put(raw, b"x"),
        lambda: client.stat(raw),
        lambda: client.mkdir(raw),
        lambda: client.rename("/ok", raw),
    ):
        with pytest.raises((InvalidPath, FileNotFoundError)):
            call()


def test_nothing_escapes_the_store_directory(client: Client, store_dir: Path) -> None:
    with pytest.raises(InvalidPath):
        client.put("/../../outside", b"x")
    client.put("/inside/../kept", b"x")
    assert client.get("/kept") == b"x"
    assert not (store_dir.parent / "outside").exists()


def test_bad_path_types_are_refused(client: Client) -> None:
    with pytest.raises(InvalidPath, match="must be a str"):
        client.stat(b"/bytes")  # type: ignore[arg-type]


@given(st.text(max_size=60))
def test_normalize_is_idempotent_and_absolute(raw: str) -> None:
    try:
        clean = normalize_path(raw)
    except InvalidPath:
        return
    assert clean.startswith("/")
    assert normalize_path(clean) == clean
    assert "//" not in clean and "/../" not in clean + "/" and "/./" not in clean + "/"
