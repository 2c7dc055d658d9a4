"""Real FUSE mounts for tests: mounted in the background as users do, always unmounted."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from graben.fuse import MountOptions, mount, unmount

NO_FUSE = not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None
needs_fuse = pytest.mark.skipif(NO_FUSE, reason="needs /dev/fuse and fusermount3")


@contextlib.contextmanager
def mounted(url: str, where: Path, **options: object) -> Iterator[Path]:
    """``url`` mounted at ``where/mnt`` (spool and log under ``where``) for the block."""
    with mounted_daemon(url, where, **options) as (point, _):
        yield point


@contextlib.contextmanager
def mounted_daemon(url: str, where: Path, **options: object) -> Iterator[tuple[Path, int]]:
    """``mounted``, with the daemon's pid (to stop or signal it)."""
    point, spool = where / "mnt", where / "spool"
    point.mkdir(parents=True, exist_ok=True)
    pid = mount(url, point, MountOptions(spool_dir=spool, **options))  # type: ignore[arg-type]
    assert pid is not None
    try:
        yield point, pid
    finally:
        unmount_and_wait(point, pid)


def unmount_and_wait(point: Path, pid: int) -> None:
    """Unmount (waiting out a busy moment); ``unmount`` returns once the daemon is gone."""
    unmount(point, busy_wait=5)
    with contextlib.suppress(ProcessLookupError):  # never leave a daemon behind
        os.kill(pid, 0)
        raise AssertionError(f"the daemon {pid} outlived its mount")
