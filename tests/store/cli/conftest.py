"""Fixtures of the ``graben`` command's tests: an isolated environment, a store, the command."""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

import pytest
from cli_kit import Graben, MiB

from graben.store.cli import _main, _render


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Never touch the user's own store, whatever a test forgets to pass.
    monkeypatch.delenv("GRABEN_URL", raising=False)
    monkeypatch.delenv("GRABEN_CHUNK_SIZE", raising=False)
    monkeypatch.setenv("GRABEN_HOME", str(tmp_path / "home"))
    # The dispatcher loads every package's entry point; the others are
    # written in parallel and a half-done one would fail every test here.
    # These tests are about the store's commands, so load only those (the
    # subprocess tests below run the real script with everything).
    ours = [e for e in entry_points(group=_main.GROUP) if e.value.startswith("graben.store.")]

    def store_entry_points(group: str) -> list[EntryPoint]:
        assert group == _main.GROUP
        return ours

    monkeypatch.setattr(_main, "entry_points", store_entry_points)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def graben(store: Path, capsysbinary: Any, monkeypatch: pytest.MonkeyPatch) -> Graben:
    return Graben(store, capsysbinary, monkeypatch)


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend stderr is a terminal and 1 MiB is a large transfer."""
    monkeypatch.setattr(_render, "stderr_is_terminal", lambda: True)
    monkeypatch.setattr(_render, "LARGE", MiB)
