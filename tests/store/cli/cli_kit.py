"""The harness of the ``graben`` command's tests: run it in-process, read what it left."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from graben.store.cli import _main

MiB = 1 << 20
COMMANDS = ("cat", "cp", "du", "fsck", "get", "ls", "mkdir", "mv", "put", "rm", "stat")


@dataclass(frozen=True)
class Result:
    """What one ``graben`` run left behind."""

    code: int
    """Exit code."""
    out: bytes
    """Everything written to stdout."""
    err: str
    """Everything written to stderr."""

    @property
    def text(self) -> str:
        """stdout as text."""
        return self.out.decode()

    def json(self) -> Any:
        """stdout parsed as one JSON document (fails if anything else is there)."""
        return json.loads(self.out)


class Graben:
    """Runs ``graben CMD --store STORE ARGS...`` in-process."""

    def __init__(self, store: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.store, self._capsys, self._monkeypatch = store, capsys, monkeypatch

    def __call__(self, cmd: str, *args: str, stdin: bytes = b"", store: bool = True) -> Result:
        self._capsys.readouterr()  # drop anything earlier calls left
        self._monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
        argv = [cmd, "--store", str(self.store), *args] if store else [cmd, *args]
        try:
            code = _main.main(argv)
        except SystemExit as exc:  # argparse: --help, usage errors
            code = int(exc.code or 0)
        captured = self._capsys.readouterr()
        return Result(code, captured.out, captured.err.decode())


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def chunk_files(store: Path) -> list[Path]:
    """Chunk files of an embedded store (``chunks/ab/cd/<64 hex>``), smallest first."""
    found = [p for p in (store / "chunks").glob("*/*/*") if len(p.name) == 64]
    return sorted(found, key=lambda p: p.stat().st_size)


def flip_byte(path: Path, offset: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def failed(result: Result, *words: str) -> None:
    """A failure a user can read: exit 1, one ``graben:`` message naming ``words``, no stdout."""
    assert result.code == 1, result
    assert result.out == b""
    assert result.err.startswith("graben: "), result.err
    assert "Traceback" not in result.err
    message = " ".join(result.err.split())  # the message may be wrapped
    for word in words:
        assert word in message, (word, message)


def run_script(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    script = Path(sys.executable).parent / "graben"
    return subprocess.run(
        [str(script), *args], input=stdin, capture_output=True, timeout=60, check=False
    )
