"""Ctrl-C: one line saying what was and was not written, never a traceback; fsck
counts the leftovers instead of listing each."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_kit import chunk_files, run_script

from graben.store import connect


@pytest.fixture(autouse=True)
def at_a_terminal() -> Iterator[None]:
    """Ctrl-C as a foreground command has it: a test run started in the background
    (``make test &``) ignores SIGINT, and the commands it starts would inherit that
    (a handler of Python's own is reset to the default in a child)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_an_interrupted_put_writes_nothing_and_says_so(store: Path, tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    with big.open("wb") as f:
        for _ in range(64):
            f.write(os.urandom(8 << 20))  # 512 MiB: uploading takes seconds here
    script = Path(sys.executable).parent / "graben"
    put = subprocess.Popen(
        [str(script), "put", "--store", str(store), str(big), "/big.bin"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while len(chunk_files(store)) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)  # some chunks are on disk: mid-upload
    put.send_signal(signal.SIGINT)
    _, err = put.communicate(timeout=60)
    assert put.returncode == 130, err
    message = err.decode()
    assert message.startswith("graben: interrupted; a file not uploaded whole is not written")
    assert "fsck --collect" in message and "Traceback" not in message
    assert len(message.strip().splitlines()) == 1
    with connect(store) as client:
        assert not client.exists("/big.bin")
    left = len(chunk_files(store))
    summary = run_script("fsck", "--store", str(store))
    lines = summary.stdout.decode().splitlines()
    assert f"{left} orphan: chunk files no metadata names" in lines[1]
    assert len(lines) == 4  # checked, the count, how to collect, the verdict
    listed = run_script("fsck", "--verbose", "--store", str(store))
    assert listed.stdout.decode().count("orphan ") == left


def test_ctrl_c_while_the_command_starts_is_one_line(store: Path) -> None:
    """Early: the store's modules still loading, the parser being built, the
    store being opened. Each moment prints one line and exits 130. (The
    interpreter's own first ~20 ms are before any of graben's code runs.)"""
    run_script("mkdir", "--store", str(store), "/runs")
    script = Path(sys.executable).parent / "graben"
    for delay in (0.05, 0.08, 0.12, 0.18, 0.25, 0.4):
        for late in range(10):
            ls = subprocess.Popen(
                [str(script), "ls", "--store", str(store), "/"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            time.sleep(delay + 0.03 * late)
            ls.send_signal(signal.SIGINT)
            out, err = ls.communicate(timeout=30)
            message = err.decode()
            if not _in_the_script_alone(message, script):
                break
            # The interpreter was still starting (a loaded machine takes longer than
            # the ~20 ms it takes here alone): no graben code ran yet. Later.
        if out == b"runs/\n" and not message:
            continue  # done before the signal (or stopped by it while exiting)
        assert ls.returncode == 130, (delay, message)
        assert message.startswith("graben: interrupted"), (delay, message)
        assert "Traceback" not in message and len(message.strip().splitlines()) == 1


def _in_the_script_alone(message: str, script: Path) -> bool:
    """Whether ``message`` is a traceback whose frames are all the console script's own
    or the import system's (the interrupt came while the interpreter ran its first
    import, finding graben's files: no graben code yet)."""
    frames = [line for line in message.splitlines() if line.strip().startswith('File "')]
    return bool(frames) and all(
        f'File "{script}"' in line or 'File "<frozen importlib' in line for line in frames
    )
