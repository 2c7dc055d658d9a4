"""Real torch ranks for tests: ``world`` processes of a script joining one gloo job."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path


def free_port() -> int:
    """A loopback port nobody listens on (for the job's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def run_ranks(
    script: Path, action: str, url: str, world: int, timeout: float = 240
) -> list[tuple[int, str]]:
    """Run ``script action url RANK WORLD PORT`` for every rank; each one's exit code and
    output (a rank still running after ``timeout`` seconds is killed: a hang fails)."""
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), action, url, str(rank), str(world), str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(world)
    ]
    outcomes = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        outcomes.append((proc.returncode, out))
    return outcomes


def assert_ok(outcomes: list[tuple[int, str]]) -> None:
    """Every rank exited 0 (else show the first failure's output)."""
    for code, out in outcomes:
        assert code == 0, out[-4000:]
