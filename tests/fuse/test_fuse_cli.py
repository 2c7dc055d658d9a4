"""``graben mount`` from the command line: a failed mount is one line, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from fuse_kit import mounted, needs_fuse

from graben.store.cli._main import main

MiB = 1 << 20


def _fails(capsys: pytest.CaptureFixture[str], argv: list[str], *words: str) -> str:
    """Run ``graben argv``: exit 1, nothing on stdout, one line on stderr naming ``words``."""
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("graben: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    line = " ".join(err.split())
    for word in words:
        assert word in line, (word, line)
    return line


@needs_fuse
def test_a_mount_the_daemon_cannot_make_says_why_and_where_the_log_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    point, spool = tmp_path / "mnt", tmp_path / "spool"
    point.mkdir()
    argv = ["mount", "nosuch://store", str(point), "--spool", str(spool)]
    line = _fails(capsys, argv, "cannot mount on", "unsupported store URL scheme 'nosuch'")
    log = spool / "mount.log"
    assert f"the daemon's log: {log}" in line
    assert "Traceback" in log.read_text()  # the details stay in the log
    assert not point.is_mount()


@needs_fuse
def test_a_mount_point_that_is_missing_a_file_or_mounted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = str(tmp_path / "store")
    _fails(capsys, ["mount", store, str(tmp_path / "nope")], "no such directory", "nope")
    (tmp_path / "file").write_bytes(b"x")
    _fails(capsys, ["mount", store, str(tmp_path / "file")], "must be a directory")
    with mounted(store, tmp_path / "m") as point:
        _fails(capsys, ["mount", store, str(point)], "already mounted", str(point))


@needs_fuse
def test_spool_limit_takes_a_human_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    point, spool = tmp_path / "mnt", tmp_path / "spool"
    point.mkdir()
    store = str(tmp_path / "store")
    assert main(["mount", store, str(point), "--spool", str(spool), "--spool-limit", "1M"]) == 0
    try:
        assert "mounted" in capsys.readouterr().out
        (point / "small").write_bytes(b"x" * 1000)
        with pytest.raises(OSError, match="No space"):  # over the spool's 1 MiB
            (point / "big").write_bytes(b"x" * (2 * MiB))
    finally:
        assert main(["umount", str(point)]) == 0


@pytest.mark.parametrize("size", ["5X", "-1", "1.5.5G", ""])
def test_spool_limit_refuses_what_is_no_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], size: str
) -> None:
    # Were the size taken, the missing mount point would still stop the mount.
    argv = ["mount", str(tmp_path / "store"), str(tmp_path / "absent"), "--spool-limit", size]
    with pytest.raises(SystemExit) as exit:
        main(argv)
    assert exit.value.code == 2
    assert "not a size" in capsys.readouterr().err
