"""Times set on a file while it is open for writing stick (issue 17): ``cp -p``,
``cp -a`` and ``tar x`` set them before they close, on a real mount."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
from fuse_kit import mounted, needs_fuse

from graben.store import Client

pytestmark = needs_fuse
PAST = 1_600_000_000_123_456_789
"""A time well before the test, to the nanosecond (the store keeps nanoseconds)."""


def _tree(root: Path) -> dict[str, int]:
    """A few files with distinct past mtimes under ``root``; their mtimes by relative name."""
    times = {}
    for i, name in enumerate(["a", "b.bin", "sub/c", "sub/deeper/d"]):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(100 + 70_000 * i))
        times[name] = PAST + i * 86_400_000_000_001
        os.utime(path, ns=(times[name], times[name]))
    return times


def _mtimes(root: Path, names: dict[str, int]) -> dict[str, int]:
    return {name: (root / name).stat().st_mtime_ns for name in names}


def test_utime_on_an_open_fd_is_kept_at_close(here: Path, direct: Client) -> None:
    fd = os.open(here / "new", os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.write(fd, b"x" * 5000)
        os.utime(fd, ns=(PAST, PAST))
        assert os.fstat(fd).st_mtime_ns == PAST
    finally:
        os.close(fd)
    assert (here / "new").stat().st_mtime_ns == PAST
    assert direct.stat(f"/{here.name}/new").mtime_ns == PAST
    # An existing file rewritten in place, the time set by path while it is open.
    with open(here / "new", "r+b") as f:
        f.write(b"y")
        f.flush()
        os.utime(here / "new", ns=(PAST + 1, PAST + 1))
    assert (here / "new").stat().st_mtime_ns == PAST + 1
    assert direct.stat(f"/{here.name}/new").mtime_ns == PAST + 1


def test_a_write_after_utime_makes_the_mtime_now_again(here: Path) -> None:
    before = time.time_ns()
    with open(here / "f", "wb") as f:
        f.write(b"first")
        f.flush()
        os.utime(f.fileno(), ns=(PAST, PAST))
        f.write(b"second")
    assert (here / "f").stat().st_mtime_ns >= before - 1_000_000_000
    assert (here / "f").read_bytes() == b"firstsecond"


@pytest.mark.parametrize("flags", ["-p", "-a"])
def test_cp_keeps_mtimes(here: Path, tmp_path: Path, flags: str) -> None:
    times = _tree(tmp_path / "src")
    subprocess.run(["cp", "-r", flags, str(tmp_path / "src"), str(here / "dst")], check=True)
    assert _mtimes(here / "dst", times) == times
    # Again over the copies: files that exist are opened, truncated and rewritten.
    subprocess.run(["cp", "-r", flags, f"{tmp_path / 'src'}/.", str(here / "dst")], check=True)
    assert _mtimes(here / "dst", times) == times


def test_tar_x_keeps_mtimes(here: Path, tmp_path: Path) -> None:
    times = _tree(tmp_path / "src")
    whole = {name: t // 1_000_000_000 * 1_000_000_000 for name, t in times.items()}
    for name, t in whole.items():  # a ustar archive keeps whole seconds
        os.utime(tmp_path / "src" / name, ns=(t, t))
    archive = tmp_path / "a.tar"
    with tarfile.open(archive, "w", format=tarfile.USTAR_FORMAT) as tar:
        tar.add(tmp_path / "src", arcname="src")
    tar_bin = shutil.which("tar")
    assert tar_bin is not None
    subprocess.run([tar_bin, "-xf", str(archive), "-C", str(here)], check=True)
    assert _mtimes(here / "src", whole) == whole


def test_a_new_stores_root_is_dated_when_it_was_made(tmp_path: Path) -> None:
    """A new embedded store's root, mounted, shows the day it was made (it was 1970)."""
    made = time.time()
    with mounted(str(tmp_path / "store"), tmp_path) as point:
        seen = os.stat(point)
    for when in (seen.st_mtime, seen.st_ctime):
        assert made - 5 <= when <= time.time() + 1, (made, seen)
