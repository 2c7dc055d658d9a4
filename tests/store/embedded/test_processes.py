"""Several processes on one embedded store; writers that die before commit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from graben.store import NoSpace, NotFound, connect

CHUNK = 64 * 1024


def _content(worker: int, i: int) -> bytes:
    return bytes([worker, i]) * (CHUNK // 2 + 1000 * i + 7)


def _worker(root: str, worker: int, files: int) -> int:
    with connect(root, chunk_size=CHUNK) as client:
        for i in range(files):
            client.put(f"/w{worker}/tmp/{i}", _content(worker, i))
            client.rename(f"/w{worker}/tmp/{i}", f"/w{worker}/f{i}")
            client.put("/shared/last", _content(worker, i))  # everyone fights over one path
            other = (worker + 1) % 4
            if client.exists(f"/w{other}/f0"):
                assert client.get(f"/w{other}/f0") == _content(other, 0)
            client.mkdir("/shared/dirs", parents=True, exist_ok=True)
    return files


def test_four_processes_share_one_store(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    with connect(root) as client:  # made first, as a user's first command would
        client.mkdir("/", exist_ok=True)
    with ProcessPoolExecutor(4) as pool:
        done = list(pool.map(_worker, [root] * 4, range(4), [15] * 4))
    assert done == [15] * 4
    with connect(root, chunk_size=CHUNK) as client:
        for worker in range(4):
            assert [i.name for i in client.ls(f"/w{worker}/tmp")] == []
            for i in range(15):
                assert client.get(f"/w{worker}/f{i}") == _content(worker, i)
        last = client.get("/shared/last")
        assert last in {_content(w, 14) for w in range(4)} | {
            _content(w, i) for w in range(4) for i in range(15)
        }
        report = client.fsck()
        assert report.ok and not report.problems


CREATOR = textwrap.dedent(
    """
    import sys, time
    from graben.store import connect
    time.sleep(max(0.0, float(sys.argv[3]) - time.time()))  # all open it at the same moment
    connect(sys.argv[1]).put(sys.argv[2], b"x")
    """
)


def test_ranks_creating_one_new_store_at_once_all_succeed(tmp_path: Path) -> None:
    """Every rank of a job may be the first to open the store (it used to fail as "locked")."""
    root = str(tmp_path / "new")
    start = str(time.time() + 2.0)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CREATOR, root, f"/r{i}", start], stderr=subprocess.PIPE
        )
        for i in range(6)
    ]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 6, errors
    with connect(root) as client:
        assert sorted(e.name for e in client.ls("/")) == [f"r{i}" for i in range(6)]


WRITER = textwrap.dedent(
    """
    import os, sys
    from graben.store import connect
    client = connect(sys.argv[1], chunk_size=65536)
    f = client.open("/ckpt/model.pt", "wb")
    block = os.urandom(65536)
    for _ in range(20):
        f.write(block + os.urandom(16))
    print("written", flush=True)
    sys.stdin.read()  # wait to be killed
    """
)


def test_kill_9_before_commit_leaves_nothing_visible(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with connect(root) as client:
        client.put("/ckpt/model.pt", b"previous checkpoint")
    with subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "written"
        time.sleep(0.3)  # let in-flight chunks land on disk
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    with connect(root, gc_grace_s=0) as client:
        assert client.get("/ckpt/model.pt") == b"previous checkpoint"
        report = client.fsck()
        orphans = [p for p in report.problems if p.kind == "orphan"]
        assert orphans, "the dead writer's uploaded chunks should show up as orphans"
        assert report.ok  # orphans are harmless
        collected = client.fsck(collect=True).collected
        assert collected == len(orphans)
        assert not [p for p in client.fsck().problems if p.kind == "orphan"]
        assert client.get("/ckpt/model.pt") == b"previous checkpoint"


def _tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
            check=True,
            capture_output=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return False
    return True


def test_full_disk_is_a_clear_error_and_loses_nothing(tmp_path: Path) -> None:
    disk = tmp_path / "small"
    if not _tmpfs(disk, "3m"):
        pytest.skip("needs root to mount a small tmpfs")
    try:
        with connect(disk / "s", chunk_size=CHUNK) as client:
            client.put("/keep", b"precious" * 1000)
            with pytest.raises(NoSpace, match="disk full") as info:
                client.put("/big", os.urandom(8 << 20))
            assert isinstance(info.value, OSError)
            assert not client.exists("/big")
            with pytest.raises(NoSpace), client.open("/big", "wb") as f:
                for _ in range(128):  # fails fast once a chunk upload has failed
                    f.write(os.urandom(CHUNK))
            assert not client.exists("/big")
            assert client.get("/keep") == b"precious" * 1000
        # The failed write's chunks are orphans; collecting them frees the disk.
        with connect(disk / "s", chunk_size=CHUNK, gc_grace_s=0) as client:
            assert client.fsck(collect=True).collected > 0
            client.put("/after", b"small")
            assert client.get("/after") == b"small"
            assert client.get("/keep") == b"precious" * 1000
    finally:
        subprocess.run(["umount", str(disk)], check=False)


LEAVER = textwrap.dedent(
    """
    import sys
    import graben.store as gs
    client = gs.connect(sys.argv[1])
    client.put("/a", b"x" * 100_000)
    reader = client.open("/a")
    reader.read(10)
    writer = client.open("/b", "wb")
    writer.write(b"y" * 100)
    print("leaving", flush=True)
    """
)


def test_exit_with_open_files_is_prompt_and_commits_nothing(tmp_path: Path) -> None:
    root = tmp_path / "s"
    done = subprocess.run(
        [sys.executable, "-W", "ignore::ResourceWarning", "-c", LEAVER, str(root)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "leaving"), done.stderr
    with connect(root) as client:
        assert client.exists("/a")
        assert not client.exists("/b")


def _flipper(root: str, rounds: int) -> int:
    with connect(root) as client:
        for i in range(rounds):
            src, dst = ("/a", "/b") if i % 2 == 0 else ("/b", "/a")
            client.rename(src, dst)
    return rounds


def test_directory_rename_is_atomic_to_a_concurrent_observer(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    with connect(root) as client:
        for i in range(100):
            client.put(f"/a/f{i:03d}", b"x")
    with ProcessPoolExecutor(1) as pool:
        flipping = pool.submit(_flipper, root, 200)
        seen = 0
        with connect(root) as client:
            while not flipping.done():
                # Each call is one read transaction: the root shows exactly one
                # of the names, and a directory that lists, lists whole.
                assert [i.name for i in client.ls("/")] in (["a"], ["b"])
                for name in ("/a", "/b"):
                    try:
                        assert len(client.ls(name)) == 100
                        seen += 1
                    except NotFound:
                        pass
        assert flipping.result() == 200
    assert seen > 10
