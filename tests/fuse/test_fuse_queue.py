"""Unlinks and attribute changes answered at once and sent in groups
(``fuse/_queue.py``), on real mounts of both kinds of store: ``rm -rf`` and
``chmod -R`` in fewer store calls than names; the callers' order holds; ``fsync`` of
the directory waits for them."""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from cluster_kit import eventually, scrape
from fuse_kit import mounted, needs_fuse
from ranks_kit import free_port

from graben.fuse._aio import Tasks
from graben.fuse._queue import ChangeQueue, Sent
from graben.store import Change, FileInfo, connect

pytestmark = needs_fuse


def _tree(top: Path, dirs: int, files: int) -> int:
    """``dirs`` directories of ``files`` files and three subdirectories each (a directory
    whose links the daemon saw last at its mkdir); how many names."""
    for d in range(dirs):
        (top / f"d{d}").mkdir(parents=True)
        os.stat(top / f"d{d}")
        for sub in ("a", "b", "c"):
            (top / f"d{d}" / sub).mkdir()
            (top / f"d{d}" / sub / "last").write_bytes(b"y")
        for f in range(files):
            (top / f"d{d}" / f"f{f}").write_bytes(b"x" * f)
    return dirs * (files + 7)


def test_rm_rf_leaves_nothing_in_fewer_calls_than_names(store_url: str, tmp_path: Path) -> None:
    port = free_port()
    with mounted(store_url, tmp_path, metrics=f"127.0.0.1:{port}") as point:
        names = _tree(point / "tree", 8, 40)
        before = scrape(port)["graben_mount_change_groups_total"]
        done = subprocess.run(["rm", "-rf", str(point / "tree")], capture_output=True, check=False)
        assert done.returncode == 0, done.stderr
        assert not (point / "tree").exists()
        with connect(store_url) as client:
            eventually(lambda: not client.exists("/tree"), 1.0)  # the coherence bound
        groups = scrape(port)["graben_mount_change_groups_total"] - before
    assert 0 < groups < names, (groups, names)  # 100-300 here for 376 names


def test_chmod_R_and_touch_in_fewer_calls_than_names(store_url: str, tmp_path: Path) -> None:
    port = free_port()
    with mounted(store_url, tmp_path, metrics=f"127.0.0.1:{port}") as point:
        names = _tree(point / "modes", 4, 30)
        before = scrape(port)["graben_mount_change_groups_total"]
        subprocess.run(["chmod", "-R", "g+w,o+x", str(point / "modes")], check=True)
        subprocess.run(
            ["touch", "-h", "-d", "2001-02-03 04:05:06", str(point / "modes" / "d1" / "f3")],
            check=True,
        )
        groups = scrape(port)["graben_mount_change_groups_total"] - before
        seen = {p: p.lstat() for p in (point / "modes").rglob("*")}
        with connect(store_url) as client:
            for p, st in seen.items():
                stored = client.stat("/" + str(p.relative_to(point)))
                assert stored.mode & 0o7777 == st.st_mode & 0o7777, p
                assert st.st_mode & 0o021 == 0o021, p
            f3 = client.stat("/modes/d1/f3")
        assert f3.mtime_ns == seen[point / "modes" / "d1" / "f3"].st_mtime_ns
        assert f3.mtime_ns == 981173106 * 10**9
    assert 0 < groups < names / 2, (groups, names)


def test_a_change_that_takes_a_right_away_is_in_the_store_when_answered(
    store_url: str, tmp_path: Path
) -> None:
    with mounted(store_url, tmp_path) as point, connect(store_url) as client:
        secret = point / "secret"
        secret.write_bytes(b"key")
        for mode in (0o640, 0o600, 0o400):
            os.chmod(secret, mode)
            assert client.stat("/secret").mode & 0o7777 == mode  # at once, not eventually
        os.chown(secret, 1234, 1234)
        assert (client.stat("/secret").uid, client.stat("/secret").gid) == (1234, 1234)


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


def test_a_group_forms_while_one_is_sent_and_refusals_come_back() -> None:
    calls: list[list[str]] = []
    kept: list[str] = []
    told: list[tuple[str, bool]] = []

    async def remove(paths: Sequence[str], dirs: Sequence[bool]) -> list[BaseException | None]:
        calls.append(list(paths))
        await asyncio.sleep(0.01)  # the store's latency
        return [
            IsADirectoryError(errno.EISDIR, "is one") if p.endswith("x") else None for p in paths
        ]

    async def set_attributes(
        changes: Sequence[tuple[str, Change]],
    ) -> list[FileInfo | BaseException]:
        calls.append([p for p, _ in changes])
        await asyncio.sleep(0.01)
        return [
            FileNotFoundError(errno.ENOENT, "gone")
            if p.endswith("gone")
            else FileInfo(p, "file", 1, 0, 5)
            for p, _ in changes
        ]

    async def back(path: str) -> None:
        kept.append(path)

    async def changed(path: str, info: FileInfo | None) -> None:
        told.append((path, info is not None))

    async def main() -> None:
        tasks = Tasks()
        queue = ChangeQueue(Sent(remove, set_attributes, back, changed))
        queue.remove("/a/0", tasks)
        await asyncio.sleep(0)
        for i in range(1, 50):
            queue.remove(f"/a/{i}", tasks)
        queue.remove("/a/x", tasks)
        queue.set_attributes("/b/f", Change(mode=0o600), tasks)
        queue.set_attributes("/b/gone", Change(mode=0o600), tasks)
        queue.remove("/b/y", tasks)
        assert "/a/7" in queue and queue.changing("/b/f")
        await queue.settled()
        assert "/a/7" not in queue and not queue.changing("/b/f")

    asyncio.run(main())
    # The first alone; then what came meanwhile, in order, a call a run of one kind.
    assert calls[0] == ["/a/0"] and len(calls[1]) == 50
    assert calls[2:] == [["/b/f", "/b/gone"], ["/b/y"]]
    assert kept == ["/a/x"]
    assert told == [("/b/f", True), ("/b/gone", False)]


def test_a_file_renamed_back_and_forth_keeps_its_inode_number(
    store_url: str, tmp_path: Path
) -> None:
    """pjdfstest's rename tests' pattern: the change feed, weighing the rows of the
    mount's own renames, must not make the kernel forget the file (a new number)."""
    with mounted(store_url, tmp_path) as point:
        a, b = point / "one", point / "two"
        a.mkdir()
        b.mkdir()
        (a / "f").write_bytes(b"f")
        number = (a / "f").stat().st_ino
        deadline = time.monotonic() + 3.0  # the feed is read every 0.2 s
        while time.monotonic() < deadline:
            (b / "g").write_bytes(b"replaced")
            os.rename(a / "f", b / "g")
            assert (b / "g").lstat().st_ino == number
            os.rename(b / "g", a / "f")
            assert (a / "f").lstat().st_ino == number
            assert not (b / "g").exists()
