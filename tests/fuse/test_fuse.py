"""The FUSE door: a real mount (embedded and 3-node cluster) driven with plain POSIX calls."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import subprocess
import threading
import uuid
from pathlib import Path

import pytest
from fuse_kit import mounted, needs_fuse

from graben.fuse import MountError, MountOptions, mount, unmount
from graben.store import Client, NotFound, connect

pytestmark = needs_fuse
RENAME_NOREPLACE = 1


def test_a_written_file_reads_back_and_is_in_the_store(here: Path, direct: Client) -> None:
    data = os.urandom(3_000_000)
    (here / "f.bin").write_bytes(data)
    assert (here / "f.bin").read_bytes() == data
    assert (here / "f.bin").stat().st_size == len(data)
    assert direct.get(f"/{here.name}/f.bin") == data


def test_random_writes_append_and_truncate(here: Path, direct: Client) -> None:
    path = here / "f"
    model = bytearray(os.urandom(1_000_000))
    path.write_bytes(model)
    with open(path, "r+b") as f:
        for offset in (0, 4095, 500_000, 999_999, 1_200_000):
            chunk = os.urandom(5000)
            f.seek(offset)
            f.write(chunk)
            model[len(model) : offset] = bytes(max(0, offset - len(model)))
            model[offset : offset + len(chunk)] = chunk
    with open(path, "ab") as f:
        f.write(b"tail")
    model += b"tail"
    assert path.read_bytes() == model
    os.truncate(path, 10)
    assert path.read_bytes() == model[:10]
    assert direct.get(f"/{here.name}/f") == model[:10]


def test_the_store_sees_a_new_version_only_when_the_file_is_closed(
    here: Path, direct: Client
) -> None:
    (here / "f").write_bytes(b"old")
    with open(here / "f", "r+b") as f:
        f.write(b"new")
        f.flush()  # Python's buffer only: the file is not closed yet
        assert direct.get(f"/{here.name}/f") == b"old"
    assert direct.get(f"/{here.name}/f") == b"new"


def test_fsync_commits_without_closing(here: Path, direct: Client) -> None:
    with open(here / "f", "wb") as f:
        f.write(b"durable")
        f.flush()
        os.fsync(f.fileno())
        assert direct.get(f"/{here.name}/f") == b"durable"


def test_a_version_written_elsewhere_is_seen_at_the_next_open(here: Path, direct: Client) -> None:
    (here / "f").write_bytes(b"one")
    assert (here / "f").read_bytes() == b"one"
    direct.put(f"/{here.name}/f", b"two, longer")
    assert (here / "f").read_bytes() == b"two, longer"


def test_directories_list_create_and_remove(here: Path) -> None:
    (here / "d" / "e").mkdir(parents=True)
    names = {f"n{i:04d}" for i in range(1000)}
    for name in names:
        (here / "d" / name).write_bytes(name.encode())
    assert set(os.listdir(here / "d")) == names | {"e"}
    with pytest.raises(OSError, match="not empty") as failed:
        (here / "d").rmdir()
    assert failed.value.errno == errno.ENOTEMPTY
    with pytest.raises(IsADirectoryError):
        os.unlink(here / "d" / "e")
    with pytest.raises(FileExistsError):
        (here / "d" / "e").mkdir()
    with pytest.raises(NotADirectoryError):
        os.rmdir(here / "d" / "n0001")
    (here / "d" / "e").rmdir()
    os.unlink(here / "d" / "n0001")
    assert len(os.listdir(here / "d")) == 999
    with pytest.raises(FileNotFoundError):
        (here / "d" / "n0001").read_bytes()


def test_renames_are_atomic_and_noreplace_refuses(here: Path, direct: Client) -> None:
    (here / "a").write_bytes(b"a")
    (here / "b").write_bytes(b"b")
    os.rename(here / "a", here / "b")
    assert (here / "b").read_bytes() == b"a"
    assert not (here / "a").exists()
    (here / "src").mkdir()
    for i in range(1000):
        (here / "src" / f"{i}").write_bytes(b"x")
    counts: list[int] = []
    stop = threading.Event()

    def watch() -> None:  # another client listing both sides while the rename runs
        while not stop.is_set():
            for side in ("src", "dst"):
                with contextlib.suppress(NotFound):
                    counts.append(len(direct.ls(f"/{here.name}/{side}")))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        os.rename(here / "src", here / "dst")
    finally:
        stop.set()
        watcher.join()
    assert len(os.listdir(here / "dst")) == 1000
    assert not (here / "src").exists()
    assert counts and set(counts) == {1000}  # never a half-moved directory
    libc = ctypes.CDLL(None, use_errno=True)
    (here / "c").write_bytes(b"c")
    result = libc.renameat2(-100, bytes(here / "c"), -100, bytes(here / "b"), RENAME_NOREPLACE)
    assert result == -1 and ctypes.get_errno() == errno.EEXIST
    assert (here / "b").read_bytes() == b"a"


def test_an_unlinked_open_file_stays_readable(here: Path) -> None:
    data = os.urandom(200_000)
    (here / "f").write_bytes(data)
    with open(here / "f", "rb") as f:
        os.unlink(here / "f")
        assert not (here / "f").exists()
        assert f.read() == data
    with open(here / "g", "wb") as g:
        g.write(b"never published")
        os.unlink(here / "g")
    assert not (here / "g").exists()


def test_concurrent_writers_to_different_files(here: Path, direct: Client) -> None:
    blobs = {f"w{i}": os.urandom(2_000_000 + i) for i in range(6)}

    def write(name: str) -> None:
        with open(here / name, "wb") as f:
            for start in range(0, len(blobs[name]), 100_000):
                f.write(blobs[name][start : start + 100_000])

    threads = [threading.Thread(target=write, args=(name,)) for name in blobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name, blob in blobs.items():
        assert direct.get(f"/{here.name}/{name}") == blob


def test_statfs_reports_the_store_space(mount_point: Path) -> None:
    st = os.statvfs(mount_point)
    assert st.f_blocks > 0
    assert 0 < st.f_bavail <= st.f_blocks


def test_a_store_not_made_yet_mounts_answers_df_and_is_made_by_its_first_write(
    tmp_path: Path,
) -> None:
    store = tmp_path / "new-store"
    with mounted(str(store), tmp_path / "m") as point:
        st = os.statvfs(point)  # df, before anything is written: the disk it will use
        assert st.f_blocks > 0 and 0 < st.f_bavail <= st.f_blocks
        df = subprocess.run(["df", "-P", str(point)], capture_output=True, text=True, check=False)
        assert df.returncode == 0, df.stderr
        assert not store.exists()  # a mount alone makes no store
        (point / "first").write_bytes(b"made")
    assert store.is_dir()
    with connect(store) as client:
        assert client.get("/first") == b"made"


def test_bad_names_get_errors_and_the_mount_lives_on(here: Path) -> None:
    with pytest.raises(OSError, match="too long") as failed:
        (here / ("x" * 300)).write_bytes(b"x")
    assert failed.value.errno == errno.ENAMETOOLONG
    with pytest.raises(FileNotFoundError):
        (here / "missing" / "f").write_bytes(b"x")
    (here / "ok").write_bytes(b"fine")
    assert (here / "ok").read_bytes() == b"fine"


def test_chmod_utime_and_chown_to_the_owner(here: Path, direct: Client) -> None:
    path = here / "f"
    path.write_bytes(b"x")
    os.chmod(path, 0o600)
    os.utime(path, ns=(5_000_000_000, 7_000_000_000))
    st = path.stat()
    assert (st.st_mode & 0o7777, st.st_mtime_ns) == (0o600, 7_000_000_000)
    assert direct.stat(f"/{here.name}/f").mode == 0o600
    path.write_bytes(b"new content keeps the mode")
    assert path.stat().st_mode & 0o7777 == 0o600
    os.chown(path, os.getuid(), os.getgid())
    (here / "d").mkdir(mode=0o700)
    assert (here / "d").stat().st_mode & 0o7777 == 0o700
    fd = os.open(here / "script", os.O_CREAT | os.O_WRONLY, 0o751)
    os.write(fd, b"#!/bin/sh\n")
    os.close(fd)
    assert (here / "script").stat().st_mode & 0o7777 == 0o751 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_symlinks(here: Path) -> None:
    (here / "target").write_bytes(b"pointed at")
    os.symlink("target", here / "link")
    assert os.readlink(here / "link") == "target"
    assert (here / "link").is_symlink()
    assert (here / "link").read_bytes() == b"pointed at"
    assert (here / "link").lstat().st_size == len("target")
    os.rename(here / "link", here / "moved")
    assert os.readlink(here / "moved") == "target"
    with pytest.raises(FileExistsError):
        os.symlink("elsewhere", here / "moved")
    os.unlink(here / "moved")
    assert (here / "target").exists()


def test_a_read_only_mount_refuses_changes(store_url: str, tmp_path: Path) -> None:
    with mounted(store_url, tmp_path, read_only=True) as point:
        with pytest.raises(OSError, match="Read-only") as failed:
            (point / f"ro-{uuid.uuid4().hex[:6]}").write_bytes(b"x")
        assert failed.value.errno == errno.EROFS
        assert os.listdir(point) is not None


def test_a_full_spool_fails_the_write_and_loses_nothing(store_url: str, tmp_path: Path) -> None:
    name = f"spool-{uuid.uuid4().hex[:6]}"
    with connect(store_url) as client:
        client.put(f"/{name}", b"committed before")
        with mounted(store_url, tmp_path, spool_limit=1 << 20) as point:
            with pytest.raises(OSError, match="No space") as failed, open(point / name, "wb") as f:
                for _ in range(4):
                    f.write(os.urandom(512 * 1024))
            assert failed.value.errno == errno.ENOSPC
            assert client.get(f"/{name}") == b"committed before"
            (point / f"{name}-small").write_bytes(b"fits")  # the spool was given back
            assert client.get(f"/{name}-small") == b"fits"
        client.rm(f"/{name}")
        client.rm(f"/{name}-small")


def test_a_big_file_written_front_to_back_then_patched(here: Path, direct: Client) -> None:
    # Front to back, the upload runs while the file is written; a write
    # behind the end, a truncate or fsync midway must still give exact bytes.
    head, tail = os.urandom(40 << 20), os.urandom(3 << 20)
    with open(here / "patched", "wb") as f:
        f.write(head)
        f.seek(1000)
        f.write(b"patch")
        f.seek(0, os.SEEK_END)
        f.write(tail)
    expected = head[:1000] + b"patch" + head[1005:] + tail
    assert direct.get(f"/{here.name}/patched") == expected
    with open(here / "cut", "wb") as f:
        f.write(head)
        f.truncate(5 << 20)
        f.seek(0, os.SEEK_END)
        f.write(tail)
    assert direct.get(f"/{here.name}/cut") == head[: 5 << 20] + tail
    with open(here / "synced", "wb") as f:
        f.write(head)
        f.flush()
        os.fsync(f.fileno())
        assert direct.get(f"/{here.name}/synced") == head
        f.write(tail)
    assert (here / "synced").read_bytes() == head + tail
    fd = os.open(here / "private", os.O_CREAT | os.O_WRONLY, 0o600)
    os.write(fd, head)
    os.close(fd)
    assert direct.stat(f"/{here.name}/private").mode == 0o600 & ~_umask()
    assert direct.get(f"/{here.name}/private") == head


def test_truncating_open_of_a_file_open_elsewhere_and_renaming_over_it(here: Path) -> None:
    with open(here / "f", "wb") as first:
        first.write(b"first writer's bytes")
        first.flush()
        with open(here / "f", "wb") as second:
            second.write(b"second")
    assert (here / "f").read_bytes() == b"second"
    (here / "new").write_bytes(b"replacement")
    with open(here / "f", "r+b") as held:
        held.write(b"S")
        os.rename(here / "new", here / "f")
    # The held handle's file was replaced: its write does not come back over the new one.
    assert (here / "f").read_bytes() == b"replacement"


def test_a_listing_has_dot_entries_and_a_second_umount_says_not_mounted(
    tmp_path: Path,
) -> None:
    with mounted(str(tmp_path / "store"), tmp_path) as point:
        (point / "d").mkdir()
        (point / "d" / "f").write_bytes(b"x")
        listed = subprocess.run(
            ["ls", "-ai", str(point / "d")], capture_output=True, text=True, check=True
        )
        inodes = {name: int(number) for number, name in map(str.split, listed.stdout.splitlines())}
        assert sorted(inodes) == [".", "..", "f"]
        assert inodes["."] == os.stat(point / "d").st_ino
        assert inodes[".."] == os.stat(point).st_ino
    with pytest.raises(MountError, match="not mounted"):
        unmount(point)


def test_a_mount_that_cannot_start_says_why_and_leaves_nothing_mounted(tmp_path: Path) -> None:
    not_a_store = tmp_path / "file"
    not_a_store.write_bytes(b"not a directory")
    (tmp_path / "mnt").mkdir()
    with pytest.raises(MountError, match="cannot mount on") as failed:
        mount(str(not_a_store), tmp_path / "mnt", MountOptions(spool_dir=tmp_path / "spool"))
    assert "must be a directory" in str(failed.value)  # the daemon's own error, in one line
    assert "the daemon's log" in str(failed.value) and "\n" not in str(failed.value)
    assert not os.path.ismount(tmp_path / "mnt")
    with pytest.raises(MountError, match="no such directory"):
        mount(str(tmp_path), tmp_path / "missing")


def test_a_small_file_is_kept_by_the_engine_and_grows_into_chunks(
    here: Path, direct: Client
) -> None:
    from graben.store.client import _loop
    from graben.store.transport import GetLayout

    def kept(name: str) -> bool:
        layout = _loop.run(direct.aio.meta.request(GetLayout(f"/{here.name}/{name}")))
        return bool(layout.inline)

    path = here / "notes.txt"
    path.write_bytes(b"first line\n")
    assert kept("notes.txt") and path.read_bytes() == b"first line\n"
    with open(path, "ab") as f:
        f.write(b"x" * 100_000)
    assert not kept("notes.txt") and path.stat().st_size == 100_011
    os.truncate(path, 5)
    assert kept("notes.txt") and path.read_bytes() == b"first"
    assert direct.get(f"/{here.name}/notes.txt") == b"first"
