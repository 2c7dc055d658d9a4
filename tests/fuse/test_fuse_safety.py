"""What a close publishes: a writer's crash, its children and its shell, on a real mount.

A file's new version must be published when its writer closes it (or
fsyncs), and never when another process closes its copy of the descriptor
(a subprocess the writer starts, a forked child): a writer killed after
that must leave the old version whole.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fuse_kit import needs_fuse, unmount_and_wait

from graben.fuse import MountError, MountOptions, mount
from graben.store import Client

pytestmark = needs_fuse
OLD = os.urandom(50_000)
"""The complete old version each test starts from."""

# Opens the file for writing, truncating it, writes 9,000 bytes, starts a
# subprocess, says so on stdout, then waits to be killed (or, with "close",
# closes the file, says so and waits for stdin to close). argv: path, how,
# where ("main" or "thread": who opens and writes).
WRITER = r"""
import os, subprocess, sys, threading
path, how, where = sys.argv[1:4]
def write():
    global fd
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    if how == "fsync":
        os.write(fd, b"synced")
        os.fsync(fd)
    os.write(fd, b"n" * 9000)
if where == "thread":
    t = threading.Thread(target=write)
    t.start()
    t.join()
    threading.Thread(target=sys.stdin.read, daemon=True).start()  # a live thread
else:
    write()
subprocess.run(["true"], check=True)
if how == "close":
    os.close(fd)
print("ready", flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def _writer(path: Path, how: str, where: str = "main") -> Iterator[subprocess.Popen[str]]:
    """The writer, once it is ready; never left running (it would keep the mount busy)."""
    with subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), how, where],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            assert process.stdout is not None
            assert process.stdout.readline() == "ready\n"
            yield process
        finally:
            if process.poll() is None:
                process.kill()
            process.communicate()


@pytest.mark.parametrize("where", ["main", "thread"])
def test_a_writer_killed_after_starting_a_subprocess_leaves_the_old_version(
    here: Path, direct: Client, where: str
) -> None:
    path = here / "f"
    path.write_bytes(OLD)
    with _writer(path, "kill", where) as writer:
        writer.kill()
        writer.communicate()
    assert writer.returncode == -signal.SIGKILL
    assert path.read_bytes() == OLD
    assert direct.get(f"/{here.name}/f") == OLD


def test_a_killed_writer_keeps_what_it_fsynced(here: Path, direct: Client) -> None:
    path = here / "f"
    path.write_bytes(OLD)
    with _writer(path, "fsync") as writer:
        assert direct.get(f"/{here.name}/f") == b"synced"  # fsync commits at once
        writer.send_signal(signal.SIGTERM)
        writer.communicate()
    assert writer.returncode == -signal.SIGTERM
    assert path.read_bytes() == b"synced"
    assert direct.get(f"/{here.name}/f") == b"synced"


def test_the_writers_close_publishes_at_once_despite_its_subprocess(
    here: Path, direct: Client
) -> None:
    path = here / "f"
    for _ in range(20):
        path.write_bytes(OLD)
        with _writer(path, "close") as writer:  # ready once the writer's close() returned
            assert direct.get(f"/{here.name}/f") == b"n" * 9000
            assert path.read_bytes() == b"n" * 9000
            writer.communicate("")
        assert writer.returncode == 0


# The parent writes, forks a child that keeps the descriptor, closes its own
# copy, lets the child go on and waits for it; the child appends and exits
# without closing.
FORKER = r"""
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC)
os.write(fd, b"parent.")
read, write = os.pipe()
if os.fork() == 0:
    os.close(write)
    os.read(read, 1)  # the parent has closed
    os.write(fd, b"child." * 1_000_000)
    os._exit(0)
os.close(fd)
os.write(write, b"x")
os.wait()
"""


def test_a_forked_child_that_writes_after_its_parent_closed_publishes_at_its_exit(
    here: Path, direct: Client
) -> None:
    path = here / "f"
    for _ in range(10):
        path.write_bytes(OLD)
        subprocess.run([sys.executable, "-c", FORKER, str(path)], check=True)
        # Committed by the child's last close, which the kernel does not wait
        # for: the mount waits for it before it answers the next open.
        assert path.read_bytes() == b"parent." + b"child." * 1_000_000
        assert direct.get(f"/{here.name}/f") == b"parent." + b"child." * 1_000_000


# The writer writes, forks a child that keeps the descriptor, and waits to be
# killed; the child, once the writer is gone, writes to the file or not, then
# closes it. argv: path, "write" or "idle".
ORPHAN = r"""
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC)
os.write(fd, b"torn.")
writer = os.getpid()
if os.fork() == 0:
    while os.getppid() == writer:
        time.sleep(0.01)
    if sys.argv[2] == "write":
        os.write(fd, b"child.")
    os.close(fd)
    print("done", flush=True)
    os._exit(0)
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize(("child", "expected"), [("idle", OLD), ("write", b"torn.child.")])
def test_a_killed_writers_child_publishes_only_what_it_wrote_to(
    here: Path, direct: Client, child: str, expected: bytes
) -> None:
    path = here / "f"
    path.write_bytes(OLD)
    with subprocess.Popen(
        [sys.executable, "-c", ORPHAN, str(path), child], stdout=subprocess.PIPE, text=True
    ) as writer:
        assert writer.stdout is not None
        assert writer.stdout.readline() == "ready\n"
        writer.kill()
        assert writer.stdout.readline() == "done\n"  # the child closed the file
        writer.communicate()
    assert path.read_bytes() == expected
    assert direct.get(f"/{here.name}/f") == expected


@pytest.mark.parametrize(
    "command",
    [
        "echo hi > f",
        "python3 -c 'print(\"hi\")' > f",
        'python3 -c \'import os; fd = os.open("f", os.O_WRONLY | os.O_TRUNC); '
        'os.write(fd, b"hi\\n"); os._exit(0)\'',
    ],
    ids=["shell", "redirected", "exit-without-close"],
)
def test_shells_and_processes_that_exit_without_closing_publish(
    here: Path, direct: Client, command: str
) -> None:
    for _ in range(10):
        (here / "f").write_bytes(OLD)
        subprocess.run(["sh", "-c", command], cwd=here, check=True)
        assert direct.get(f"/{here.name}/f") == b"hi\n"
        assert (here / "f").read_bytes() == b"hi\n"


# -- the spool and the log: in a directory only the user can change -------------

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="plants files as another user")


@pytest.fixture
def sticky(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A world-writable sticky directory (a /tmp of our own), made the temporary directory."""
    where = tmp_path / "tmp"
    where.mkdir()
    where.chmod(0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(where))
    return where


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file only its owner may read or write, that no mount must ever touch."""
    path = tmp_path / "victim"
    path.write_bytes(b"secret\n")
    path.chmod(0o600)
    return path


def _plant(directory: Path, target: Path, mode: int = 0o755) -> None:
    """Another user's directory holding a ``mount.log`` that links to ``target``."""
    directory.mkdir(mode=mode)
    directory.chmod(mode)
    os.symlink(target, directory / "mount.log")
    os.lchown(directory / "mount.log", NOBODY, NOBODY)
    os.chown(directory, NOBODY, NOBODY)


@contextlib.contextmanager
def _refused(point: Path, match: str, **options: Any) -> Iterator[None]:
    """Expect the mount at ``point`` to be refused (and unmount it if it was not)."""
    point.mkdir(exist_ok=True)
    try:
        with pytest.raises(MountError, match=match):
            pid = mount(str(point.parent / "store"), point, MountOptions(**options))
            unmount_and_wait(point, pid)  # the test has failed: leave nothing mounted
        yield
    finally:
        assert not os.path.ismount(point)


def test_the_default_spool_is_the_users_own_private_directory(sticky: Path, tmp_path: Path) -> None:
    point = tmp_path / "mnt"
    point.mkdir()
    pid = mount(str(tmp_path / "store"), point)
    try:
        (point / "f").write_bytes(b"x")
    finally:
        unmount_and_wait(point, pid)
    bases = [p for p in sticky.iterdir() if p.is_dir()]
    assert len(bases) == 1 and str(os.getuid()) in bases[0].name
    for directory in (bases[0], bases[0] / "spool"):  # the user's graben directory, the spool
        st = directory.lstat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (os.geteuid(), 0o700)
    log = (bases[0] / "spool" / "mount.log").lstat()
    assert (log.st_uid, stat.S_IMODE(log.st_mode)) == (os.geteuid(), 0o600)


@needs_root
def test_a_spool_planted_by_another_user_is_refused(
    sticky: Path, victim: Path, tmp_path: Path
) -> None:
    # Whatever name the default takes, another user got there first.
    for name in ("graben-spool", f"graben-{os.getuid()}"):
        _plant(sticky / name, victim)
    with _refused(tmp_path / "mnt", "belongs to uid 65534"):
        pass
    assert victim.read_bytes() == b"secret\n"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600


@needs_root
def test_a_spool_that_is_a_symbolic_link_is_refused(
    sticky: Path, victim: Path, tmp_path: Path
) -> None:
    ours = tmp_path / "ours"  # the link leads to a directory we own, with the trap inside
    ours.mkdir(mode=0o700)
    os.symlink(victim, ours / "mount.log")
    for name in ("graben-spool", f"graben-{os.getuid()}"):
        os.symlink(ours, sticky / name)
        os.lchown(sticky / name, NOBODY, NOBODY)
    with _refused(tmp_path / "mnt", "symbolic link"):
        pass
    assert victim.read_bytes() == b"secret\n"


@needs_root
def test_a_log_file_that_is_a_link_is_not_followed(
    sticky: Path, victim: Path, tmp_path: Path
) -> None:
    log = sticky / "mount.log"
    os.symlink(victim, log)
    os.lchown(log, NOBODY, NOBODY)
    with _refused(tmp_path / "mnt", "symbolic link", log_file=log):
        pass
    os.unlink(log)
    os.link(victim, log)  # a hard link: the victim's own inode under the log's name
    with _refused(tmp_path / "mnt", "link", log_file=log):
        pass
    assert victim.read_bytes() == b"secret\n"


def test_a_spool_others_may_write_in_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with _refused(tmp_path / "mnt", "writable by others", spool_dir=shared):
        pass
    assert list(shared.iterdir()) == []
