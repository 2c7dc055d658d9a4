"""Fixtures of the store's tests (the session's cluster and clients: ../conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from pg_kit import (  # noqa: F401  (the PostgreSQL fixtures, for every test below)
    engine_fixture,
    pg_cluster_fixture,
    pg_database_fixture,
    pg_server_fixture,
    pg_url_fixture,
)


def _chunk_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "chunks").glob("??/??/*") if p.is_file())


@pytest.fixture
def chunk_files(store_dir: Path) -> Callable[[], list[Path]]:
    """A function listing the embedded store's chunk files."""
    return lambda: _chunk_files(store_dir)
