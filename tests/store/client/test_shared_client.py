"""``shared_client``: one client per store and options per process, skipped and cleared."""

from __future__ import annotations

from pathlib import Path

import pytest

from graben.store import clear_shared_clients, connect, shared_client


def test_one_client_per_store_and_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRABEN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GRABEN_URL", raising=False)
    default = shared_client()
    assert shared_client(None) is default is shared_client(tmp_path / "home")  # one store
    assert shared_client(read_ahead=0) is not default  # other options, another client
    assert shared_client(tmp_path / "other") is not default
    with connect() as mine:  # connect skips the registry: a client of one's own
        assert mine is not default
    monkeypatch.setenv("GRABEN_HOME", str(tmp_path / "elsewhere"))
    assert shared_client() is not default  # the environment names another store now


def test_a_closed_or_cleared_client_is_made_again(tmp_path: Path) -> None:
    first = shared_client(tmp_path)
    first.put("/a", b"a")
    first.close()  # someone closed it: the next caller still gets a working one
    second = shared_client(tmp_path)
    assert second is not first and second.get("/a") == b"a"
    clear_shared_clients()
    assert second.closed
    assert shared_client(tmp_path).get("/a") == b"a"
