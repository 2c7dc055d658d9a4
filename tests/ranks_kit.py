"""Real torch ranks for tests: ``world`` processes of a script joining one gloo job."""

from __future__ import annotations

import shutil
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
            threads = stacks(proc.pid)
            proc.kill()
            out, _ = proc.communicate()
            out += f"\n[killed after {timeout} s; its threads then]\n{threads}"
        outcomes.append((proc.returncode, out))
    return outcomes


def stacks(pid: int) -> str:
    """Every thread's stack in process ``pid`` (py-spy, if installed): what a hang was at."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        return "(py-spy not installed)"
    dump = [spy, "dump", "--native", "--pid", str(pid)]
    done = subprocess.run(dump, capture_output=True, text=True, check=False, timeout=60)
    return done.stdout + done.stderr


def assert_ok(outcomes: list[tuple[int, str]]) -> None:
    """Every rank exited 0 (else show the first failure's output)."""
    for code, out in outcomes:
        assert code == 0, out[-4000:]
