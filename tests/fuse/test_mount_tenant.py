"""A mount with a tenant's token (``graben mount --token-file``) on the session's cluster:
it shows the way to the token's prefix and nothing of another tenant's (not even its
name: the mount looks names up in the listings it was given), and a write
past the tenant's quota fails with EDQUOT."""

from __future__ import annotations

import errno
import os
import subprocess
import time
from pathlib import Path

import pytest
from fuse_kit import mounted, needs_fuse

from graben.store import connect

pytestmark = needs_fuse
MiB = 1 << 20


def test_a_mount_with_a_token_reaches_its_prefix_only(cluster_url: str, tmp_path: Path) -> None:
    with connect(cluster_url) as operator:
        operator.add_tenant("mount-a", "/mount-teams/a", max_bytes=4 * MiB)
        operator.add_tenant("mount-b", "/mount-teams/b")
        operator.put("/mount-teams/b/secret.bin", b"b's weights")
        token = operator.issue_token("mount-a", ttl_s=600)
    token_file = tmp_path / "a.token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    with mounted(cluster_url, tmp_path, token_file=token_file) as point:
        assert os.listdir(point) == ["mount-teams"]
        assert os.listdir(point / "mount-teams") == ["a"]
        mine = point / "mount-teams" / "a" / "notes.txt"
        mine.write_bytes(b"a's notes")
        assert mine.read_bytes() == b"a's notes"
        df = os.statvfs(point)  # its quota is its disk: it may not see the nodes'
        assert df.f_blocks * df.f_frsize == 4 * MiB
        assert 0 < (4 * MiB - df.f_bavail * df.f_frsize) <= 64 * 1024
        theirs = point / "mount-teams" / "b"
        for attempt in (
            lambda: os.stat(theirs),
            lambda: list(os.scandir(theirs)),
            (theirs / "secret.bin").read_bytes,
            lambda: (theirs / "planted").write_bytes(b"x"),
            lambda: os.rename(mine, theirs / "notes.txt"),
        ):
            with pytest.raises((PermissionError, FileNotFoundError)):  # b is not even seen
                attempt()
        assert _write(point / "mount-teams" / "a" / "big.bin", 8) == errno.EDQUOT
        assert mine.read_bytes() == b"a's notes"
    with connect(cluster_url) as operator:
        assert operator.get("/mount-teams/b/secret.bin") == b"b's weights"
        assert operator.quotas("/mount-teams/a")[0].bytes <= 4 * MiB


def _write(path: Path, mib: int) -> int:
    """Write ``mib`` MiB to a new file and fsync it; the errno it failed with (0: none)."""
    try:
        with open(path, "wb") as f:
            for _ in range(mib):
                f.write(os.urandom(MiB))
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        return exc.errno or -1
    return 0


@pytest.mark.parametrize(
    ("rights", "prefix", "listed", "target", "says"),
    [
        ("r", "/deny/a", ["deny", "deny/a"], "deny/a/f", "Read-only file system"),
        ("rw", "/deny/a/mine", ["deny", "deny/a"], "deny/a/f", "Permission denied"),
        ("rw", "/deny/b", ["deny"], "deny/f", "Permission denied"),
        ("rw", "/deny/b", ["deny"], "deny/a/f", ""),  # a is not even seen
    ],
    ids=["read-only-inside", "rw-outside-after-ls", "prefix-elsewhere", "prefix-elsewhere-deep"],
)
def test_a_write_the_token_may_not_make_fails_at_open(
    cluster_url: str,
    tmp_path: Path,
    rights: str,
    prefix: str,
    listed: list[str],
    target: str,
    says: str,
) -> None:
    """``echo > f; echo $?`` prints non-zero, and ``ls`` never shows ``f`` (issue 50, 5):
    the mount knows its token's rights and prefix (``whoami``) and refuses at create
    what the store would refuse at the commit, after the writer's close."""
    with connect(cluster_url) as operator:
        for tenant in ("a", "b"):
            if f"deny-{tenant}" not in operator.tenants():
                operator.add_tenant(f"deny-{tenant}", f"/deny/{tenant}")
        operator.mkdir("/deny/a/mine", exist_ok=True)
        token = operator.issue_token(f"deny-{prefix.split('/')[2]}", prefix=prefix, rights=rights)
    token_file = tmp_path / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    with mounted(cluster_url, tmp_path, token_file=token_file) as point:
        shell = f"cd {point} && ls {' '.join(listed)} > /dev/null; echo hi > {target}; echo $?"
        done = subprocess.run(
            ["sh", "-c", shell], check=False, capture_output=True, text=True, timeout=60
        )
        assert done.stdout.strip() not in ("", "0"), done
        assert says in done.stderr
        parent, name = os.path.split(point / target)
        for _ in range(5):  # not now, nor once a close could have been refused
            assert name not in _listed(parent)
            time.sleep(0.1)
        df = subprocess.run(["df", "-P", str(point)], capture_output=True, text=True, check=False)
        assert df.returncode == 0, df.stderr  # no quota: shown unbounded (1 PiB), as JuiceFS
        assert os.statvfs(point).f_blocks * os.statvfs(point).f_frsize == 1 << 50
    with connect(cluster_url) as operator:
        assert not operator.exists(f"/{target}")


def _listed(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError:  # not even seen
        return []
