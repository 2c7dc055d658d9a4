"""Shared fixtures: stores to run the conformance tests against."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from graben.store import Client, connect

SMALL_CHUNK = 64 * 1024
"""Chunk size for tests that want many chunks from few bytes."""


def _chunk_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "chunks").glob("??/??/*") if p.is_file())


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    """An empty directory for an embedded store."""
    return tmp_path / "store"


@pytest.fixture(params=["embedded"])
def client(request: pytest.FixtureRequest, store_dir: Path) -> Iterator[Client]:
    """A sync client on each kind of store (the cluster adds itself here)."""
    with connect(store_dir, chunk_size=SMALL_CHUNK) as c:
        yield c


@pytest.fixture
def chunk_files(store_dir: Path) -> Callable[[], list[Path]]:
    """A function listing the embedded store's chunk files."""
    return lambda: _chunk_files(store_dir)
