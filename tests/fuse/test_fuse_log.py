"""Ordinary writes through the mount log no error (issue 50, item 8).

A shell's ``echo >``, ``cp``, appends, a rewrite in the middle, a truncate and
files of one byte to a few chunks, on each kind of store, and writes the store
refuses at their commit (past a tenant's quota): the daemon's log, read once
it is unmounted, holds no ``ERROR`` line. (A refused put's traceback kept
slices of the spool file's view alive, and the mapping could not be closed:
"a view of a spool file outlived its put".)
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest
from fuse_kit import mounted, needs_fuse, unmount_and_wait

from graben.fuse import MountOptions, mount
from graben.store import Client, connect

pytestmark = needs_fuse
MiB = 1 << 20


def _write_as_people_do(where: Path, source: Path) -> None:
    shell = f"echo hi > {where}/echo; echo more >> {where}/echo; cp {source} {where}/copy"
    subprocess.run(["sh", "-c", shell], check=True, timeout=60)
    for size in (1, 4096, MiB + 1, 20 * MiB + 3):
        (where / f"f{size}").write_bytes(os.urandom(size))
    with open(where / f"f{20 * MiB + 3}", "r+b") as f:  # a rewrite in the middle
        f.seek(5 * MiB)
        f.write(b"middle")
    os.truncate(where / f"f{MiB + 1}", 1000)
    with open(where / "f4096", "ab") as f:
        f.write(b"tail")
        f.flush()
        os.fsync(f.fileno())


def test_ordinary_writes_log_no_error(store_url: str, direct: Client, tmp_path: Path) -> None:
    source = tmp_path / "source.bin"
    source.write_bytes(os.urandom(3 * MiB))
    with mounted(store_url, tmp_path, log_level="debug") as point:
        where = point / f"log-{os.urandom(4).hex()}"
        where.mkdir()
        _write_as_people_do(where, source)
        assert (where / "echo").read_text() == "hi\nmore\n"
        assert (where / "copy").read_bytes() == source.read_bytes()
        assert os.path.getsize(where / f"f{MiB + 1}") == 1000
        for name in os.listdir(where):  # each one's last close is done
            os.stat(where / name)
    assert_no_error(tmp_path / "spool" / "mount.log")
    direct.rm(f"/{where.name}", recursive=True)


def test_writes_refused_at_their_commit_log_no_error(cluster_url: str, tmp_path: Path) -> None:
    with connect(cluster_url) as operator:
        operator.add_tenant("log-quota", "/log-quota", max_bytes=2 * MiB)
        token = operator.issue_token("log-quota", ttl_s=600)
    token_file = tmp_path / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    with mounted(cluster_url, tmp_path, token_file=token_file) as point:
        for size in (3 * MiB, 12 * MiB):  # put from the spool; uploaded while written
            path = point / "log-quota" / f"big{size}"
            with pytest.raises(OSError, match="quota") as refused, open(path, "wb") as f:
                f.write(os.urandom(size))  # the close is refused
            assert refused.value.errno == errno.EDQUOT
            assert not path.exists()  # and its last close is done
    assert_no_error(tmp_path / "spool" / "mount.log")


def assert_no_error(log: Path) -> None:
    """The daemon's log has no error in it."""
    lines = log.read_text().splitlines()
    errors = [line for line in lines if " ERROR " in line or "Traceback" in line]
    assert not errors, "\n".join(errors)


def test_two_mounts_sharing_a_log_say_which_mount_each_line_is(
    store_url: str, tmp_path: Path
) -> None:
    """Every mount of a spool logs to its one ``mount.log``: each line names its mount
    point and daemon pid (a point with a newline in its name cannot forge a line)."""
    log = tmp_path / "spool" / "mount.log"
    firsts, pids = {}, []
    for name in ("one", "two\nINFO forged"):
        point = tmp_path / name / "mnt"
        point.mkdir(parents=True)
        pid = mount(store_url, point, MountOptions(spool_dir=tmp_path / "spool", log_file=log))
        assert pid is not None
        pids.append(pid)
        unmount_and_wait(point, pid)
        firsts[name] = point
    lines = log.read_text().splitlines()
    mounted_lines = [line for line in lines if " mounted " in line]
    assert len(mounted_lines) == 2, lines
    one, two = mounted_lines
    assert f"mount {firsts['one']} pid {pids[0]} graben.fuse: mounted" in one
    escaped = str(firsts["two\nINFO forged"]).replace("\n", "\\n")
    assert f"mount {escaped} pid {pids[1]} graben.fuse: mounted" in two
    assert not any(line.startswith("INFO forged") for line in lines)
