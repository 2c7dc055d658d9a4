"""The mount daemon's metrics and log level, on a real mount read with a real HTTP GET."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from cluster_kit import eventually, scrape, sum_of
from fuse_kit import mounted, needs_fuse
from ranks_kit import free_port

from graben.fuse import MountError, MountOptions, mount
from graben.store import connect

pytestmark = needs_fuse
MiB = 1 << 20


def test_mount_metrics_move_with_reads_writes_and_failures(tmp_path: Path) -> None:
    store = tmp_path / "store"
    data = os.urandom(9 * MiB)
    with connect(os.fspath(store)) as client:
        client.put("/made-elsewhere", data)  # never in this mount's page cache
    port = free_port()
    with mounted(os.fspath(store), tmp_path, metrics=f"127.0.0.1:{port}") as point:
        before = scrape(port)
        assert before["graben_mount_spool_bytes"] == 0
        assert before["graben_mount_spool_limit_bytes"] == MountOptions().spool_limit
        (point / "written").write_bytes(data[: 3 * MiB])
        with open(point / "written", "rb+") as held:
            held.write(b"x")
            during = scrape(port)
        assert (point / "made-elsewhere").read_bytes() == data
        assert not (point / "missing").exists()
        after = scrape(port)
    assert during["graben_mount_open_files"] >= 1
    assert during["graben_mount_spool_bytes"] >= 3 * MiB  # the open file is staged
    assert after["graben_mount_open_files"] == 0
    assert after['graben_request_bytes_total{op="write"}'] == 3 * MiB + 1
    assert after['graben_response_bytes_total{op="read"}'] >= len(data)
    assert after['graben_requests_total{op="lookup",outcome="ENOENT"}'] >= 1
    assert sum_of(after, r'graben_requests_total\{op="write",outcome="ok"\}') >= 1
    assert sum_of(after, r'graben_request_seconds_count\{op="read"\}') >= 1
    # 9 MiB read front to back: blocks fetched ahead answer most of the kernel's reads.
    assert (
        after["graben_mount_read_ahead_hits_total"] > after["graben_mount_read_ahead_misses_total"]
    )


def test_mount_log_level_and_line_format(tmp_path: Path) -> None:
    store = os.fspath(tmp_path / "store")
    connect(store).close()
    quiet, loud = tmp_path / "quiet", tmp_path / "loud"
    with mounted(store, quiet, log_level="warning"):
        pass
    with mounted(store, loud, log_level="debug"):
        pass
    quiet_log = (quiet / "spool" / "mount.log").read_text()
    loud_log = (loud / "spool" / "mount.log").read_text()
    assert "mounted" not in quiet_log
    line = next(x for x in loud_log.splitlines() if "mounted" in x)
    # time, level, which mount (point and daemon pid: mounts share a log), component
    assert re.match(
        rf"\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{{3}} INFO mount {re.escape(str(loud / 'mnt'))} "
        r"pid \d+ graben\.fuse: mounted ",
        line,
    )


def test_bad_metrics_address_fails_the_mount(tmp_path: Path) -> None:
    store = os.fspath(tmp_path / "store")
    connect(store).close()
    point = tmp_path / "mnt"
    point.mkdir()
    options = MountOptions(spool_dir=tmp_path / "spool", metrics="nowhere")
    with pytest.raises(MountError, match="HOST:PORT"):
        mount(store, point, options)
    assert not os.path.ismount(point)


def test_a_missing_name_is_asked_once_while_the_kernel_remembers_it(tmp_path: Path) -> None:
    """A lookup that finds nothing is answered with a negative entry: probing the same
    missing name again (``git status``, ``import``) costs no trip to the daemon within the
    entry timeout; made by another client, the name is seen within a second."""
    store = tmp_path / "store"
    with connect(os.fspath(store)) as client:
        client.put("/other", b"there")
    port = free_port()
    with mounted(os.fspath(store), tmp_path, metrics=f"127.0.0.1:{port}", timeout=30) as point:
        for _ in range(20):
            assert not (point / "missing").exists()
        asked = scrape(port)['graben_requests_total{op="lookup",outcome="ENOENT"}']
        with connect(os.fspath(store)) as client:
            client.put("/missing", b"now here")
        seen = eventually((point / "missing").exists, 5)
    assert asked == 1
    assert seen < 2.0
