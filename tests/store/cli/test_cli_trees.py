"""Whole trees from the command line: ``get -r``, ``cp`` (server-side), ``du --physical``.

Real embedded stores (``cli_kit.Graben``, in-process); ``du --physical`` on
the session's 3-node cluster too, where each chunk has three copies.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import msgspec
import pytest
from cli_kit import Graben, MiB, chunk_files, failed, write

from graben.store import Client, FileInfo, connect


def _tree(graben: Graben, root: str = "/runs/ckpt") -> None:
    graben("put", "-", f"{root}/meta.json", stdin=b"{}")
    graben("put", "-", f"{root}/shards/0.bin", stdin=b"zero" * 1000)
    graben("put", "-", f"{root}/shards/1.bin", stdin=b"one")
    graben("mkdir", "-p", f"{root}/empty")


def _local_tree(root: Path) -> dict[str, bytes | None]:
    """Every entry below ``root``: a file's bytes, ``None`` for a directory."""
    found: dict[str, bytes | None] = {}
    for top, dirs, files in os.walk(root):
        for name in dirs:
            found[os.path.relpath(os.path.join(top, name), root)] = None
        for name in files:
            found[os.path.relpath(os.path.join(top, name), root)] = Path(top, name).read_bytes()
    return found


CKPT = {
    "empty": None,
    "meta.json": b"{}",
    "shards": None,
    os.path.join("shards", "0.bin"): b"zero" * 1000,
    os.path.join("shards", "1.bin"): b"one",
}


# --- get -r -----------------------------------------------------------------------------


def test_get_recursive_downloads_a_tree(graben: Graben, tmp_path: Path) -> None:
    _tree(graben)
    failed(graben("get", "/runs/ckpt", str(tmp_path / "x")), "is a directory", "get -r")
    assert not (tmp_path / "x").exists()

    assert graben("get", "-r", "/runs/ckpt", str(tmp_path / "x")).code == 0  # a new name
    assert _local_tree(tmp_path / "x") == CKPT
    (tmp_path / "into").mkdir()
    assert graben("get", "-r", "/runs/ckpt", str(tmp_path / "into")).code == 0  # into a dir
    assert _local_tree(tmp_path / "into" / "ckpt") == CKPT


def test_get_recursive_into_a_missing_directory_named_with_a_slash(
    graben: Graben, tmp_path: Path
) -> None:
    """``graben get -r /runs/ckpt ./dl/`` (the docs' form) makes ``dl``, as rsync does."""
    _tree(graben)
    assert graben("get", "-r", "/runs/ckpt", f"{tmp_path / 'dl' / 'deep'}/").code == 0
    assert _local_tree(tmp_path / "dl" / "deep" / "ckpt") == CKPT


def test_get_recursive_replaces_files_unless_exclusive(graben: Graben, tmp_path: Path) -> None:
    _tree(graben)
    local = tmp_path / "ckpt"
    write(local / "shards" / "1.bin", b"mine")
    write(local / "notes", b"kept")

    failed(graben("get", "-r", "-x", "/runs/ckpt", str(tmp_path) + "/"), "exists", "1.bin")
    assert (local / "shards" / "1.bin").read_bytes() == b"mine"  # nothing was written
    assert not (local / "meta.json").exists()

    assert graben("get", "-r", "/runs/ckpt", str(tmp_path) + "/").code == 0
    assert _local_tree(local) == {**CKPT, "notes": b"kept"}  # others' files stay


def test_get_recursive_never_follows_a_local_link(graben: Graben, tmp_path: Path) -> None:
    _tree(graben)
    outside = tmp_path / "outside"
    outside.mkdir()
    local = tmp_path / "dl" / "ckpt"
    local.mkdir(parents=True)
    (local / "shards").symlink_to(outside)  # a planted link where a directory goes
    (local / "meta.json").symlink_to(outside / "victim")

    failed(graben("get", "-r", "/runs/ckpt", str(tmp_path / "dl")), "symbolic link", "shards")
    assert os.listdir(outside) == []  # nothing written through either link


def test_get_recursive_refuses_a_local_file_where_a_directory_goes(
    graben: Graben, tmp_path: Path
) -> None:
    _tree(graben)
    write(tmp_path / "ckpt" / "shards", b"a file")
    failed(graben("get", "-r", "/runs/ckpt", str(tmp_path) + "/"), "shards")
    assert (tmp_path / "ckpt" / "shards").read_bytes() == b"a file"


def test_get_recursive_of_a_file_is_a_get(graben: Graben, tmp_path: Path) -> None:
    graben("put", "-", "/f", stdin=b"data")
    assert graben("get", "-r", "/f", str(tmp_path / "g")).code == 0
    assert (tmp_path / "g").read_bytes() == b"data"


def test_get_recursive_of_a_missing_path(graben: Graben, tmp_path: Path) -> None:
    graben("mkdir", "/d")
    failed(graben("get", "-r", "/nope", str(tmp_path / "x")), "no such", "/nope")
    assert not (tmp_path / "x").exists()


# --- cp ---------------------------------------------------------------------------------


def test_cp_copies_a_file_without_moving_bytes(graben: Graben) -> None:
    data = os.urandom(3 * MiB)
    graben("put", "-", "/a", stdin=data)
    chunks = chunk_files(graben.store)
    assert graben("cp", "/a", "/b").code == 0
    assert graben("cat", "/b").out == data
    assert chunk_files(graben.store) == chunks  # the copy shares the chunks: no new bytes
    graben("put", "-", "/a", stdin=b"changed")  # the copy is its own file
    assert graben("cat", "/b").out == data


def test_cp_into_a_directory_and_no_clobber(graben: Graben) -> None:
    graben("put", "-", "/a", stdin=b"new")
    graben("put", "-", "/d/a", stdin=b"old")
    failed(graben("cp", "-n", "/a", "/d/"), "exists", "/d/a")
    assert graben("cat", "/d/a").out == b"old"
    assert graben("cp", "/a", "/d/").code == 0
    assert graben("cat", "/d/a").out == b"new"


def test_cp_recursive_copies_a_tree(graben: Graben) -> None:
    _tree(graben)
    failed(graben("cp", "/runs/ckpt", "/best"), "is a directory", "cp -r")
    assert graben("cp", "-r", "/runs/ckpt", "/best").code == 0
    listing = graben("ls", "/best", "--json").json()
    assert [e["path"] for e in listing] == ["/best/empty", "/best/meta.json", "/best/shards"]
    assert graben("cat", "/best/shards/0.bin").out == b"zero" * 1000
    assert graben("du", "/best", "--json").json()["files"] == 3
    failed(graben("cp", "-r", "/runs", "/runs/ckpt/inner"), "into itself")


def test_cp_of_a_missing_source(graben: Graben) -> None:
    graben("mkdir", "/d")
    failed(graben("cp", "/nope", "/x"), "no such", "/nope")


# --- du --physical ------------------------------------------------------------------------


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRABEN_CHUNK_SIZE", str(64 * 1024))


def test_du_physical_counts_each_chunk_once(graben: Graben, small_chunks: None) -> None:
    block = os.urandom(64 * 1024)
    graben("put", "-", "/d/a", stdin=block * 4)  # 4 identical chunks of 64 KiB: one held
    graben("cp", "/d/a", "/d/b")  # shares it
    graben("put", "-", "/d/c", stdin=b"tail")
    graben("put", "-", "/elsewhere", stdin=os.urandom(1000))

    logical = graben("du", "/d", "--json").json()
    assert logical == {"path": "/d", "files": 3, "bytes": 8 * len(block) + 4}  # unchanged
    physical = graben("du", "--physical", "/d", "--json").json()
    assert physical == {
        "path": "/d",
        "files": 3,
        "bytes": 8 * len(block) + 4,
        "physical_bytes": len(block) + 4,
        "chunks": 2,
    }
    on_disk = sum(p.stat().st_size for p in chunk_files(graben.store))
    assert on_disk == len(block)  # the small files' bytes are in the engine, not in files
    assert graben("du", "--physical", "-H", "/d").text == "64.0 KiB  3 files  /d\n"


def test_du_physical_counts_every_copy_on_a_cluster(
    graben: Graben, cluster_url: str, small_chunks: None
) -> None:
    root = f"{cluster_url}/du-physical-{os.getpid()}"
    block = os.urandom(64 * 1024)
    assert graben("put", "-", f"{root}/a", stdin=block * 2, store=False).code == 0
    try:
        got = graben("du", "--physical", root, "--json", store=False).json()
        assert got["chunks"] == 1
        assert got["physical_bytes"] == 3 * len(block)  # three copies of one chunk
    finally:
        with connect(cluster_url) as client:
            client.rm(root.removeprefix(cluster_url), recursive=True)


@pytest.mark.parametrize("name", ["..", ".", ""])
def test_get_recursive_refuses_a_listed_name_that_would_escape(
    graben: Graben, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    # The store's paths never hold such a name; a damaged or hostile listing could.
    graben("put", "-", "/d/f", stdin=b"payload")
    real_ls = Client.ls

    def hostile_ls(client: Client, path: str = "/") -> list[FileInfo]:
        listed = real_ls(client, path)
        return [msgspec.structs.replace(i, path=f"{path.rstrip('/')}/{name}") for i in listed]

    monkeypatch.setattr(Client, "ls", hostile_ls)
    (tmp_path / "dl").mkdir()
    failed(graben("get", "-r", "/d", str(tmp_path / "dl")), "not one plain name")
    assert os.listdir(tmp_path / "dl") == []  # refused while listing: nothing written
    assert sorted(os.listdir(tmp_path)) == ["dl", "store"]


def test_links_made_through_a_mount_are_neither_followed_nor_made(
    graben: Graben, tmp_path: Path
) -> None:
    _tree(graben)
    with connect(graben.store) as client:  # what a mount's symlink(2) stores
        client.put("/runs/ckpt/escape", b"/etc", permissions=stat.S_IFLNK | 0o777)
    got = graben("get", "-r", "/runs/ckpt", str(tmp_path / "dl"))
    assert got.code == 0
    assert got.err == "graben: skipped the symbolic link /runs/ckpt/escape\n"
    assert _local_tree(tmp_path / "dl") == CKPT  # no link made, nothing written outside

    assert graben("cp", "-r", "/runs/ckpt", "/copy").code == 0
    assert graben("stat", "/copy/escape").code == 1
    failed(graben("get", "/runs/ckpt/escape", str(tmp_path / "x")), "symbolic link")
    failed(graben("cp", "/runs/ckpt/escape", "/x"), "symbolic link")


def test_du_physical_counts_a_tree_files_leave_while_it_walks(graben: Graben) -> None:
    """A file or directory removed between its listing and its layout is no longer held
    for the tree: ``du --physical`` counts the rest instead of failing (a checkpoint's
    retention removes steps while an operator watches the disk)."""
    with connect(graben.store, inline_max=0) as client:
        for d in range(20):
            for f in range(15):
                client.put(f"/runs/s{d:02d}/f{f:02d}", os.urandom(100))
        removing = threading.Thread(target=_remove_all, args=(client, 20))
        removing.start()
        outcomes = []
        while removing.is_alive():
            outcomes.append(graben("du", "--physical", "/runs", "--json"))
        removing.join()
    assert [o.err for o in outcomes if o.code != 0] == []
    assert len(outcomes) > 1


def _remove_all(client: Client, dirs: int) -> None:
    for d in range(dirs):
        for f in range(15):
            client.rm(f"/runs/s{d:02d}/f{f:02d}")
        client.rm(f"/runs/s{d:02d}")
