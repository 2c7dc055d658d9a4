"""Two mounts of one cluster, as two hosts would have: each sees the other's changes.

A name created, renamed or removed, or a file rewritten, through one mount
(or through the API, or another process on an embedded store) shows on the
other within a second, and nothing stale is served after that: not a name
from the kernel's cache, not an attribute, not a page of the old bytes. The
kernel may cache names and attributes for 30 s (the mount's default
``timeout``): the mount's change feed (``fuse/_follow.py``) is what keeps
these within the second (0.1-0.3 s here; a 1 s kernel cache took 1.0 s for a
rename or an unlink before it).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fuse_kit import mounted, mounted_daemon

from graben.store import connect

SEEN_WITHIN_S = 1.0


@pytest.fixture(scope="module")
def two(cluster_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    with (
        mounted(cluster_url, tmp_path_factory.mktemp("one")) as one,
        mounted(cluster_url, tmp_path_factory.mktemp("two")) as other,
    ):
        yield one, other


def _within(check: Callable[[], bool], what: str) -> float:
    """Seconds until ``check`` held; fails past ``SEEN_WITHIN_S`` (with a little slack for
    the poll itself)."""
    started = time.monotonic()
    while not check():
        waited = time.monotonic() - started
        assert waited < SEEN_WITHIN_S + 0.25, f"{what}: not seen after {waited:.2f} s"
        time.sleep(0.02)
    return time.monotonic() - started


def _is(path: Path, data: bytes) -> bool:
    try:
        return path.read_bytes() == data
    except FileNotFoundError:
        return False


def test_each_mount_sees_the_others_changes_within_a_second(two: tuple[Path, Path]) -> None:
    one, other = two
    top = f"c-{os.urandom(4).hex()}"
    (one / top).mkdir()
    _within((other / top).is_dir, "a directory made on the other mount")
    # The other mount looks first: its kernel now holds the name as missing, then as there.
    assert not (other / top / "f").exists()
    (one / top / "f").write_bytes(b"first")
    _within(lambda: _is(other / top / "f", b"first"), "a file created on the other mount")
    assert os.listdir(other / top) == ["f"]
    (one / top / "f").write_bytes(b"second, longer")  # a new version: size and bytes
    _within(lambda: _is(other / top / "f", b"second, longer"), "a file rewritten")
    assert (other / top / "f").stat().st_size == len(b"second, longer")
    os.rename(one / top / "f", one / top / "g")
    _within(lambda: not (other / top / "f").exists() and (other / top / "g").exists(), "a rename")
    assert os.listdir(other / top) == ["g"]
    (one / top / "g").unlink()
    _within(lambda: not (other / top / "g").exists(), "an unlink")
    assert os.listdir(other / top) == []


def test_a_change_through_the_api_shows_on_a_mount(
    two: tuple[Path, Path], cluster_url: str
) -> None:
    one, _ = two
    name = f"a-{os.urandom(4).hex()}"
    with connect(cluster_url) as client:
        client.put(f"/{name}", b"from the API")
        _within(lambda: _is(one / name, b"from the API"), "a put through the API")
        assert (one / name).read_bytes() == b"from the API"  # its pages are now cached
        client.put(f"/{name}", b"again, from the API")
        _within(lambda: _is(one / name, b"again, from the API"), "an overwrite")
        client.rm(f"/{name}")
        _within(lambda: not (one / name).exists(), "a removal through the API")


def test_a_directory_the_mount_holds_whole_learns_names_made_elsewhere(
    two: tuple[Path, Path], cluster_url: str
) -> None:
    """A directory the mount listed or made is held whole (a new name's lookup is
    answered without the store): names made elsewhere in it, or on the way to a file
    written below it, show within the second all the same."""
    one, _ = two
    top = f"w-{os.urandom(4).hex()}"
    (one / top).mkdir()  # made here: held, empty
    (one / top / "mine").write_bytes(b"x")
    assert os.listdir(one / top) == ["mine"]  # listed: held
    assert not (one / top / "theirs").exists()
    with connect(cluster_url) as client:
        client.put(f"/{top}/theirs", b"from the API")
        _within(lambda: _is(one / top / "theirs", b"from the API"), "a name made elsewhere")
        client.put(f"/{top}/deep/er/f", b"below")  # makes deep/ and deep/er/ on the way
        _within(lambda: _is(one / top / "deep" / "er" / "f", b"below"), "directories on the way")
    assert sorted(os.listdir(one / top)) == ["deep", "mine", "theirs"]


def test_a_change_by_another_process_shows_on_an_embedded_mount(
    tmp_path: Path,
) -> None:
    """An embedded store mounted here and written by another process (``graben put``,
    ``graben mv``, ``graben rm`` on the store's directory)."""
    import subprocess
    import sys

    store = tmp_path / "store"
    with connect(str(store)) as client:
        client.put("/f", b"first")
    with mounted(str(store), tmp_path / "m") as point:
        assert (point / "f").read_bytes() == b"first"
        os.stat(point / "f")  # the kernel holds the name and its attributes now
        source = tmp_path / "src"

        def graben(*args: str) -> None:
            argv = [sys.executable, "-m", "graben.store.cli", *args, "--store", str(store)]
            subprocess.run(argv, check=True, capture_output=True, timeout=60)

        source.write_bytes(b"second, from elsewhere")
        graben("put", str(source), "/f")
        took = [_within(lambda: _is(point / "f", b"second, from elsewhere"), "a put elsewhere")]
        assert (point / "f").stat().st_size == len(b"second, from elsewhere")
        graben("mv", "/f", "/g")
        took.append(
            _within(lambda: not (point / "f").exists() and (point / "g").exists(), "a move")
        )
        graben("rm", "/g")
        took.append(_within(lambda: not (point / "g").exists(), "a removal elsewhere"))
        assert os.listdir(point) == []
        print("seen after", ", ".join(f"{t:.2f} s" for t in took))


def test_a_mount_that_missed_changes_forgets_everything_it_held(tmp_path: Path) -> None:
    """Rows it never saw were pruned (a mount away longer than the feed keeps them): the
    kernel is made to forget every name and attribute, so nothing stale stays 30 s."""
    import sqlite3

    store = tmp_path / "store"
    with connect(str(store)) as client:
        client.put("/f", b"old")
        client.put("/gone", b"soon")
    with (
        mounted_daemon(str(store), tmp_path / "m") as (point, daemon),
        connect(str(store)) as client,
    ):
        assert (point / "f").stat().st_size == 3 and (point / "gone").exists()
        time.sleep(0.5)  # the mount's place in the feed: after these
        os.kill(daemon, signal.SIGSTOP)  # away: it sees none of what follows as it happens
        try:
            client.put("/f", b"newer and longer")
            client.rm("/gone")
            with sqlite3.connect(store / "meta.db") as db:  # pruned before it looked
                db.execute("DELETE FROM changes")
            client.put("/marker", b"m")  # a row past the gap: the mount sees it lost some
        finally:
            os.kill(daemon, signal.SIGCONT)
        _within(lambda: (point / "f").stat().st_size == len(b"newer and longer"), "a lost write")
        assert not (point / "gone").exists()
        assert (point / "f").read_bytes() == b"newer and longer"
