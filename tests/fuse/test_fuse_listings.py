"""Directory listings the daemon answers again without asking the store (``Listings``):
after every kind of change, here or by another client, a listing and the attributes it
gives the kernel are the store's, on a real mount."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from cluster_kit import eventually
from fuse_kit import mounted, needs_fuse

from graben.store import Client, connect

pytestmark = needs_fuse


def _mounts_view(directory: Path) -> dict[str, tuple[int, int, int, int]]:
    """Each name listed with (mode, size, mtime, links) as the kernel then has them: the
    listing is read first (readdirplus hands the kernel each entry's attributes)."""
    names = os.listdir(directory)
    return {n: _attrs(os.lstat(directory / n)) for n in sorted(names)}


def _attrs(st: os.stat_result) -> tuple[int, int, int, int]:
    size = st.st_size if stat.S_ISREG(st.st_mode) else 0
    return st.st_mode & 0o7777, size, st.st_mtime_ns, st.st_nlink


def _stores_view(client: Client, path: str) -> dict[str, tuple[int, int, int, int]]:
    return {
        i.name: (i.mode & 0o7777, i.size if i.is_file else 0, i.mtime_ns, i.nlink)
        for i in sorted(client.ls(path), key=lambda i: i.name)
    }


def test_a_listing_answered_again_shows_every_change_made_since(tmp_path: Path) -> None:
    store = os.fspath(tmp_path / "store")
    with connect(store) as client:
        client.mkdir("/d")
    with mounted(store, tmp_path) as point, connect(store) as client:
        d = point / "d"
        (d / "a").write_bytes(b"a")
        (d / "b").write_bytes(b"b")
        (d / "sub").mkdir()

        def agree() -> bool:
            for _ in range(2):  # the second listing is the one kept
                assert _mounts_view(d) == _stores_view(client, "/d")
            return True

        agree()
        os.chmod(d / "a", 0o600)  # taken away: in the store before it is answered
        agree()
        os.chmod(d / "a", 0o640)  # added: answered at once, sent in a group
        agree()
        with open(d / "b", "ab") as f:
            f.write(b"more bytes")
        agree()
        os.utime(d / "b", ns=(1_000_000_000, 2_000_000_000))
        agree()
        (d / "sub" / "x").write_bytes(b"x")  # sub's mtime, in d's listing
        agree()
        os.rename(d / "a", d / "sub" / "a")
        agree()
        assert sorted(os.listdir(d / "sub")) == ["a", "x"]
        os.link(d / "b", d / "sub" / "b2")  # b's links, as d's listing shows them
        agree()
        os.unlink(d / "sub" / "b2")
        agree()
        os.unlink(d / "b")
        agree()
        os.rename(d / "sub", d / "moved")
        agree()
        assert sorted(os.listdir(d / "moved")) == ["a", "x"]
        (d / "moved" / "a").unlink()
        (d / "moved" / "x").unlink()
        os.rmdir(d / "moved")
        agree()
        assert os.listdir(d) == []


def test_a_listing_kept_here_shows_another_clients_changes_within_a_second(
    tmp_path: Path,
) -> None:
    store = os.fspath(tmp_path / "store")
    with connect(store) as client:
        client.put("/d/kept", b"1")
    with mounted(store, tmp_path) as point, connect(store) as client:
        d = point / "d"
        assert os.listdir(d) == ["kept"] and os.listdir(d) == ["kept"]
        client.put("/d/new", b"22")
        client.set_attributes("/d/kept", mode=0o600)
        seconds = eventually(lambda: sorted(os.listdir(d)) == ["kept", "new"], 5)
        assert seconds < 1.5
        eventually(lambda: _mounts_view(d) == _stores_view(client, "/d"), 5)
        client.rm("/d/new")
        eventually(lambda: os.listdir(d) == ["kept"], 5)
