"""Unlinks answered at once and removed in groups (``fuse/_removals.py``), on real
mounts of both kinds of store: ``rm -rf`` leaves nothing, in far fewer store calls
than names; the callers' order holds; ``fsync`` of the directory waits for them."""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest
from cluster_kit import eventually, scrape
from fuse_kit import mounted, needs_fuse
from ranks_kit import free_port

from graben.fuse._aio import Tasks
from graben.fuse._removals import Removals
from graben.store import connect

pytestmark = needs_fuse


def _tree(top: Path, dirs: int, files: int) -> int:
    for d in range(dirs):
        (top / f"d{d}" / "inner").mkdir(parents=True)
        for f in range(files):
            (top / f"d{d}" / f"f{f}").write_bytes(b"x" * f)
        (top / f"d{d}" / "inner" / "last").write_bytes(b"y")
    return dirs * (files + 3)


def test_rm_rf_leaves_nothing_in_fewer_calls_than_names(store_url: str, tmp_path: Path) -> None:
    port = free_port()
    with mounted(store_url, tmp_path, metrics=f"127.0.0.1:{port}") as point:
        names = _tree(point / "tree", 8, 40)
        before = scrape(port)["graben_mount_removal_groups_total"]
        subprocess.run(["rm", "-rf", str(point / "tree")], check=True)
        assert not (point / "tree").exists()
        with connect(store_url) as client:
            eventually(lambda: not client.exists("/tree"), 1.0)  # the coherence bound
        groups = scrape(port)["graben_mount_removal_groups_total"] - before
    assert 0 < groups < names / 2, (groups, names)  # 8-100 groups here for 344 names


def test_the_same_name_unlinked_and_made_again_keeps_the_callers_order(
    store_url: str, tmp_path: Path
) -> None:
    with mounted(store_url, tmp_path) as point:
        (point / "loop").mkdir()
        target = point / "loop" / "f"
        for i in range(100):
            target.write_bytes(f"version {i}".encode())
            target.unlink()
            assert not target.exists()
            target.write_bytes(f"again {i}".encode())
            os.link(target, point / "loop" / "g")
            target.unlink()
            assert (point / "loop" / "g").read_bytes() == f"again {i}".encode()
            assert (point / "loop" / "g").stat().st_nlink == 1
            (point / "loop" / "g").rename(target)
        assert sorted(os.listdir(point / "loop")) == ["f"]
    with connect(store_url) as client:
        assert client.get("/loop/f") == b"again 99"
        assert [e.name for e in client.ls("/loop")] == ["f"]


def test_fsync_of_the_directory_waits_for_its_unlinks(store_url: str, tmp_path: Path) -> None:
    with mounted(store_url, tmp_path) as point, connect(store_url) as client:
        (point / "sync").mkdir()
        for i in range(50):
            (point / "sync" / str(i)).write_bytes(b"z")
        before = (point / "sync").stat()
        for i in range(50):
            os.unlink(point / "sync" / str(i))
        after = (point / "sync").stat()  # answered before the store has them all
        fd = os.open(point / "sync", os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        assert client.ls("/sync") == []  # at once, not eventually
        (point / "sync" / "sub").mkdir()
        links = (point / "sync").stat().st_nlink
        os.rmdir(point / "sync" / "sub")
        assert (point / "sync").stat().st_nlink == links - 1
    assert after.st_mtime_ns >= before.st_mtime_ns and after.st_ctime_ns >= before.st_ctime_ns


def test_rmdir_of_a_directory_not_empty_still_says_so(store_url: str, tmp_path: Path) -> None:
    with mounted(store_url, tmp_path) as point, connect(store_url) as other:
        (point / "full" / "in").mkdir(parents=True)
        (point / "full" / "in" / "f").write_bytes(b"f")
        os.listdir(point / "full" / "in")  # held whole, not empty
        with pytest.raises(OSError, match="not empty"):
            os.rmdir(point / "full" / "in")
        other.put("/full/in/g", b"made elsewhere")
        os.unlink(point / "full" / "in" / "f")
        # Whether or not the change feed told the daemon of g yet: the store refuses
        # (ENOTEMPTY now, or after the rmdir was answered: then the name comes back).
        try:
            os.rmdir(point / "full" / "in")
            said = 0
        except OSError as exc:
            said = exc.errno or 0
        assert said in (0, errno.ENOTEMPTY)
        assert other.get("/full/in/g") == b"made elsewhere"
        eventually((point / "full" / "in" / "g").exists, 2.0)
        assert not (point / "full" / "in" / "f").exists() and not other.exists("/full/in/f")


# -- the queue alone, with a store function of the test's own --------------------------


def test_a_group_forms_while_one_is_removed_and_refusals_come_back() -> None:
    calls: list[list[str]] = []
    back: list[str] = []

    async def remove(paths: Sequence[str], dirs: Sequence[bool]) -> list[BaseException | None]:
        calls.append(list(paths))
        await asyncio.sleep(0.01)  # the store's latency
        return [
            NotADirectoryError(errno.EISDIR, "is a dir") if p.endswith("x") else None for p in paths
        ]

    async def put_back(path: str) -> None:
        back.append(path)

    async def main() -> None:
        tasks = Tasks()
        removals = Removals(remove, put_back)
        removals.add("/a/0", tasks)
        await asyncio.sleep(0)
        for i in range(1, 50):
            removals.add(f"/a/{i}", tasks)
        removals.add("/a/x", tasks)
        assert "/a/7" in removals
        await removals.settled()
        assert "/a/7" not in removals

    asyncio.run(main())
    assert calls[0] == ["/a/0"] and len(calls) == 2 and len(calls[1]) == 50
    assert back == ["/a/x"]
