"""Bit flips in ``meta.db``: caught where rows become values, found by fsck, never collected.

Each test flips real bytes of one table's page in a closed store's database
(the kind of damage SQLite's own checks do not see: a value changes, the
b-tree stays well formed), then checks what a user sees.
"""

from __future__ import annotations

import os
import random
import sqlite3
from pathlib import Path

import pytest
from store_kit import SMALL_CHUNK

from graben.store import IntegrityError, connect

ChunkFiles = list[Path]


def _chunk_files(root: Path) -> ChunkFiles:
    return sorted(p for p in (root / "chunks").glob("??/??/*") if p.is_file())


def _table_page(db: Path, table: str) -> tuple[int, int]:
    """Byte offset and size of a (small) table's one page."""
    conn = sqlite3.connect(db)
    try:
        (size,) = conn.execute("PRAGMA page_size").fetchone()
        (root,) = conn.execute(
            "SELECT rootpage FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
        ).fetchone()
    finally:
        conn.close()
    return (root - 1) * size, size


def _flip(db: Path, table: str, needle: bytes, at: int, xor: int) -> None:
    """XOR one byte of ``table``'s page: the one ``at`` bytes from where ``needle`` starts."""
    start, size = _table_page(db, table)
    data = bytearray(db.read_bytes())
    found = data.find(needle, start, start + size)
    assert found >= 0, f"{needle!r} is not in {table}'s page"
    data[found + at] ^= xor
    db.write_bytes(bytes(data))


def _flip_id(db: Path, table: str, chunk: str) -> None:
    """Change one digit of a chunk id in ``table``: still well formed, of a chunk nobody has."""
    digit = next(i for i, c in enumerate(chunk) if c.isdigit())
    _flip(db, table, chunk.encode(), digit, 0x01)  # "0" <-> "1", "2" <-> "3", ...


def _store(root: Path, files: int = 5) -> dict[str, bytes]:
    contents = {f"/d/file-{i}": os.urandom(3 * SMALL_CHUNK) for i in range(files)}
    with connect(root, chunk_size=SMALL_CHUNK) as client:
        for path, data in contents.items():
            client.put(path, data)
    assert not Path(f"{root / 'meta.db'}-wal").exists()  # all of it in meta.db now
    return contents


def _chunk_of(root: Path, path: str, index: int = 1) -> str:
    conn = sqlite3.connect(root / "meta.db")
    try:
        name = path.rsplit("/", 1)[1]
        (chunk,) = conn.execute(
            "SELECT x.chunk FROM entries e JOIN extents x ON x.inode = e.inode "
            "WHERE e.name = ? ORDER BY x.offset LIMIT 1 OFFSET ?",
            (name, index),
        ).fetchone()
    finally:
        conn.close()
    return str(chunk)


def _metadata_problems(root: Path) -> list[str]:
    with connect(root, gc_grace_s=0) as client:
        report = client.fsck()
    assert not report.ok
    return [p.detail for p in report.problems if p.kind == "metadata"]


def _collect_refuses(root: Path) -> None:
    before = {p: p.read_bytes() for p in _chunk_files(root)}
    with connect(root, gc_grace_s=0) as client, pytest.raises(IntegrityError, match="metadata"):
        client.fsck(collect=True)
    assert {p: p.read_bytes() for p in _chunk_files(root)} == before


def test_an_extent_naming_a_chunk_the_store_lacks(tmp_path: Path) -> None:
    root = tmp_path / "s"
    contents = _store(root)
    chunk = _chunk_of(root, "/d/file-2")
    _flip_id(root / "meta.db", "extents", chunk)
    with connect(root) as client:
        with pytest.raises(IntegrityError, match=r"chunk row.*/d/file-2"):
            client.get("/d/file-2")
        assert client.get("/d/file-1") == contents["/d/file-1"]
    details = " / ".join(_metadata_problems(root))
    assert "no chunk row" in details or "chunk layer" in details
    assert "refs" in details
    _collect_refuses(root)


def test_a_chunk_row_whose_id_flipped_leaves_no_orphan_to_collect(tmp_path: Path) -> None:
    root = tmp_path / "s"
    _store(root)
    chunk = _chunk_of(root, "/d/file-3")
    _flip_id(root / "meta.db", "chunks", chunk)
    with connect(root, gc_grace_s=0) as client:
        with pytest.raises(IntegrityError, match=r"chunk row.*/d/file-3"):
            client.get("/d/file-3")
        report = client.fsck()
        orphans = [p.chunk for p in report.problems if p.kind == "orphan"]
        assert chunk not in orphans  # its file is live: an extent names it
        assert [p for p in report.problems if p.kind == "metadata"]
    _collect_refuses(root)


def test_a_flipped_file_size_is_an_integrity_error_not_an_index_error(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with connect(root, chunk_size=SMALL_CHUNK) as client:
        client.put("/d/file-0", os.urandom(0x033039))  # 3 chunks and a bit
    # SQLite keeps the size as a 3-byte integer; its middle byte gains 16 KiB.
    _flip(root / "meta.db", "inodes", b"\x03\x30\x39", 1, 0x40)
    with connect(root) as client, pytest.raises(IntegrityError, match=r"checksum.*/d/file-0"):
        client.get("/d/file-0")
    assert any("size" in d for d in _metadata_problems(root))
    _collect_refuses(root)


def test_a_row_that_does_not_decode_is_an_integrity_error(tmp_path: Path) -> None:
    root = tmp_path / "s"
    contents = _store(root, files=2)
    # One file inode's kind: "file" -> "fime", neither a file nor a directory.
    _flip(root / "meta.db", "inodes", b"file", 2, 0x01)
    conn = sqlite3.connect(root / "meta.db")
    (bad,) = conn.execute(
        "SELECT '/d/' || e.name FROM entries e JOIN inodes i ON i.id = e.inode "
        "WHERE i.kind = 'fime'"
    ).fetchone()
    conn.close()
    (good,) = set(contents) - {bad}
    with connect(root) as client:
        with pytest.raises(IntegrityError, match="does not decode"):
            client.stat(bad)
        with pytest.raises(IntegrityError, match="does not decode"):
            client.get(bad)
        assert client.get(good) == contents[good]
    assert any("does not decode" in d for d in _metadata_problems(root))
    _collect_refuses(root)


def test_an_entry_naming_a_missing_inode_is_refused_and_found_by_fsck(tmp_path: Path) -> None:
    root = tmp_path / "s"
    _store(root)
    # entries rows are (parent, name, inode): the inode follows the name.
    _flip(root / "meta.db", "entries", b"file-2", len(b"file-2"), 0x40)
    with connect(root) as client:
        for look in (lambda: client.ls("/d"), lambda: client.stat("/d/file-2")):
            with pytest.raises(IntegrityError, match="metadata damaged") as refused:
                look()  # never a listing that leaves the name out, nor "no such file"
            assert refused.value.path == "/d/file-2"
    details = " / ".join(_metadata_problems(root))
    assert "/d/file-2" in details  # fsck names it: the entry without its inode
    assert "no entry" in details  # and the inode nobody names
    _collect_refuses(root)


def test_a_healthy_store_has_no_metadata_problems(tmp_path: Path) -> None:
    root = tmp_path / "s"
    contents = _store(root)
    with connect(root, chunk_size=SMALL_CHUNK, gc_grace_s=0) as client:
        client.copy("/d/file-0", "/copy")  # shared chunks: refs > 1
        client.rm("/d/file-1")  # unreferenced chunk rows
        client.put("/empty", b"")
        report = client.fsck()
        assert report.ok and not report.problems
        assert client.fsck(collect=True).collected == 3
        assert client.get("/copy") == contents["/d/file-0"]


def _seen(root: Path) -> dict[str, object]:
    """Everything a user can see of the store: each path's attributes and bytes."""
    seen: dict[str, object] = {}
    with connect(root) as client:
        todo = ["/"]
        while todo:
            for info in client.ls(todo.pop()):
                seen[info.path] = info
                if info.kind == "directory":
                    todo.append(info.path)
                else:
                    seen[info.path + "#bytes"] = client.get(info.path)
    return seen


def _cells(db: Path, table: str) -> tuple[int, int]:
    """Where ``table``'s one page keeps its cells: from its cell content area to its end."""
    start, size = _table_page(db, table)
    page = db.read_bytes()[start : start + size]
    return start + int.from_bytes(page[5:7], "big"), start + size


def test_every_one_of_a_hundred_bit_flips_is_caught_or_changes_nothing(tmp_path: Path) -> None:
    """Single bits flipped at random in the rows that say what a file is (names, times,
    modes, extents, chunks): each one is an ``IntegrityError`` on reading, a problem fsck
    reports, or no change anyone can see; never a changed answer with fsck passing."""
    root = tmp_path / "s"
    _store(root, files=4)
    with connect(root, chunk_size=SMALL_CHUNK) as client:
        client.mkdir("/d/sub")
        client.put("/d/sub/tiny", b"kept by the engine itself")
        client.set_attributes("/d/file-1", mode=0o600, mtime_ns=-1_500_000_000, uid=1000)
    db = root / "meta.db"
    clean = db.read_bytes()
    expected = _seen(root)
    rng = random.Random(32)
    areas = [_cells(db, table) for table in ("inodes", "entries", "extents", "chunks")]
    silent = []
    for flip in range(100):
        start, end = rng.choice(areas)
        at, bit = rng.randrange(start, end), rng.randrange(8)
        damaged = bytearray(clean)
        damaged[at] ^= 1 << bit
        db.write_bytes(bytes(damaged))
        try:
            seen = _seen(root)
            with connect(root, gc_grace_s=0) as client:
                report = client.fsck()
        except IntegrityError:  # loud: reads, or fsck, refuse the damaged database
            continue
        if seen != expected and not [p for p in report.problems if p.kind == "metadata"]:
            changed = sorted(
                k for k in expected.keys() | seen.keys() if expected.get(k) != seen.get(k)
            )
            silent.append(f"flip {flip}: byte {at} bit {bit} changed {changed}")
    db.write_bytes(clean)
    assert silent == []
    assert _seen(root) == expected
