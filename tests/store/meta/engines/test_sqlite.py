"""The SQLite engine: schema versions, migrations, durability settings."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from graben.store import GrabenError, IntegrityError, NotADirectory, connect
from graben.store.meta._repo import Inode, Tx
from graben.store.meta.engines._schema import MIGRATIONS
from graben.store.meta.engines._sqlite import SQLiteRepository


def test_new_store_is_at_the_latest_schema_in_wal_mode(tmp_path: Path) -> None:
    with connect(tmp_path / "s") as client:
        client.mkdir("/", exist_ok=True)  # a store is made by its first write
    db = sqlite3.connect(tmp_path / "s" / "meta.db")
    assert db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()


def test_reopening_keeps_data_and_does_not_migrate_twice(tmp_path: Path) -> None:
    with connect(tmp_path / "s") as client:
        client.put("/a", b"kept")
    for _ in range(2):
        with connect(tmp_path / "s") as client:
            assert client.get("/a") == b"kept"


def test_store_from_a_newer_graben_is_refused_clearly(tmp_path: Path) -> None:
    with connect(tmp_path / "s") as client:
        client.mkdir("/", exist_ok=True)
    db = sqlite3.connect(tmp_path / "s" / "meta.db")
    db.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    db.commit()
    db.close()
    with pytest.raises(GrabenError, match="newer than this graben"):
        SQLiteRepository(tmp_path / "s" / "meta.db")


def test_failed_transaction_rolls_back_everything(tmp_path: Path) -> None:
    repo = SQLiteRepository(tmp_path / "meta.db")
    made: list[Inode] = []

    def half(tx: Tx) -> None:
        made.append(tx.tree.create(Inode(0, "directory", 0, 0o755, 0, 1, 1)))
        tx.tree.link(1, "half", made[0].id)
        raise RuntimeError("crash mid-transaction")

    with pytest.raises(RuntimeError):
        repo.transact(half)
    with repo.read() as tx:
        assert tx.tree.lookup(1, "half") is None
    repo.close()


def test_garbage_database_is_a_clear_integrity_error(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "meta.db").write_bytes(os.urandom(5000))
    with pytest.raises(IntegrityError, match="damaged or not a graben store"):
        connect(tmp_path / "s")


def test_a_file_is_not_a_store(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(NotADirectory, match="must be a directory"):
        connect(tmp_path / "file")
