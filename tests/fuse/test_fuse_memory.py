"""A mount left running gives back what a burst of I/O needed (a real daemon's RSS)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from fuse_kit import mounted_daemon, needs_fuse

from graben.store import connect

pytestmark = needs_fuse
MiB = 1 << 20


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        line = next(x for x in f if x.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def test_an_idle_mount_gives_back_its_chunk_buffers(tmp_path: Path) -> None:
    store = os.fspath(tmp_path / "store")
    connect(store).close()
    block = os.urandom(MiB)
    with mounted_daemon(store, tmp_path) as (point, pid):
        with open(point / "big", "wb") as f:
            for _ in range(256):
                f.write(block)
        with open(point / "big", "rb") as f:
            while f.read(4 * MiB):
                pass
        busy = _rss(pid)
        deadline = time.monotonic() + 10
        while _rss(pid) > busy * 0.6 and time.monotonic() < deadline:
            time.sleep(0.5)
        idle = _rss(pid)
        assert idle <= busy * 0.6, (busy // MiB, idle // MiB)  # 102 -> 42 MiB; 110 -> 82 before
        assert (point / "big").stat().st_size == 256 * MiB  # and it still serves
