"""Real FUSE mounts for tests: mounted in the background as users do, always unmounted."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from graben.fuse import MountOptions, mount

NO_FUSE = not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None
needs_fuse = pytest.mark.skipif(NO_FUSE, reason="needs /dev/fuse and fusermount3")


@contextlib.contextmanager
def mounted(url: str, where: Path, **options: object) -> Iterator[Path]:
    """``url`` mounted at ``where/mnt`` (spool and log under ``where``) for the block."""
    point, spool = where / "mnt", where / "spool"
    point.mkdir(parents=True, exist_ok=True)
    pid = mount(url, point, MountOptions(spool_dir=spool, **options))  # type: ignore[arg-type]
    assert pid is not None
    try:
        yield point
    finally:
        unmount_and_wait(point, pid)


def unmount_and_wait(point: Path, pid: int) -> None:
    """Unmount (retrying while busy), then make sure the daemon is gone."""
    for _ in range(50):
        done = subprocess.run(["fusermount3", "-u", str(point)], capture_output=True, check=False)
        if done.returncode == 0 or not os.path.ismount(point):
            break
        time.sleep(0.1)
    else:
        subprocess.run(["fusermount3", "-u", "-z", str(point)], check=False)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (our child, not reaped) is gone for our purposes.
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG) != (0, 0):
            return False
    return True
