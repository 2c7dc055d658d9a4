"""A mount with a tenant's token (``graben mount --token-file``) on the session's cluster:
it shows the way to the token's prefix and nothing of another tenant's (not even its
name: the mount looks names up in the listings it was given), and a write
past the tenant's quota fails with EDQUOT."""

from __future__ import annotations

import errno
import os
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
