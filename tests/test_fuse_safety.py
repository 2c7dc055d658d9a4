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
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fuse_kit import needs_fuse

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
