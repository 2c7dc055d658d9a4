"""Single servers: each a ``graben`` child process started by its argv, stopped by
signal; the wait for data nodes to report; a new cluster secret."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .._config import TLS
from .._errors import Unavailable
from ..wire import auth

READY_TIMEOUT_S = 30.0
"""How long ``wait_for_nodes`` waits for the data nodes to report."""
STOP_TIMEOUT_S = 10.0
"""How long ``stop`` lets a server shut down after SIGTERM before it kills it."""


def spawn(*argv: str) -> tuple[subprocess.Popen[str], str]:
    """Start ``graben *argv`` (a server: ``meta serve ...``, ``node serve ...``) and
    return it with the address it listens on, once it says so on its first line.

    A server that says anything else is killed and raises ``Unavailable``; so is one
    whose start is interrupted (Ctrl-C). Its stdout is a pipe: ``stop`` closes it.
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "graben.store.cli", *argv],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    try:
        line = proc.stdout.readline().strip()
    except BaseException:  # interrupted: leave nothing of it behind
        _abandon(proc)
        raise
    if not line.startswith("listening on "):
        _abandon(proc)
        raise Unavailable(f"graben {argv[0]} did not start (said {line!r})")
    return proc, line.removeprefix("listening on ")


def _abandon(proc: subprocess.Popen[str]) -> None:
    """A server that did not start: killed, reaped, and its pipe closed."""
    proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def stop(procs: Sequence[subprocess.Popen[str]]) -> None:
    """Stop servers: SIGTERM to each still running, last started first; then each
    reaped (killed if it outlives ``STOP_TIMEOUT_S``) and its pipe closed."""
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def kill(proc: subprocess.Popen[str]) -> None:
    """SIGKILL one server (no shutdown of its own), reaped, its pipe closed."""
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def wait_for_nodes(
    url: str, count: int, token: str | None = None, since: float = 0.0, *, tls: TLS | None = None
) -> None:
    """Return once ``count`` data nodes have heartbeated to the cluster at ``url`` (at or
    after unix time ``since``: a restarted cluster's engine still lists its nodes' old
    addresses, alive for a while yet); ``Unavailable`` after ``READY_TIMEOUT_S``.
    ``token``: the client's (``None``: the environment's). ``tls``: the servers' own
    TLS (``None``: plaintext, whatever the environment says)."""
    from ..client import connect  # only here: every graben command imports this module

    deadline = time.monotonic() + READY_TIMEOUT_S
    with connect(url, token=token, tls=tls, wait=READY_TIMEOUT_S) as client:
        while time.monotonic() < deadline:
            nodes = client.health().nodes
            if sum(n.alive and n.last_seen >= since for n in nodes) >= count:
                return
            time.sleep(0.1)
    raise Unavailable(f"the data nodes did not all report to {url} within {READY_TIMEOUT_S} s")


def make_secret_file(path: Path) -> Path:
    """A new random secret in a 0600 file at ``path``, unless one is there already;
    returns ``path``."""
    with contextlib.suppress(FileExistsError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(auth.new_secret() + "\n")
            f.flush()
            os.fsync(f.fileno())
    return path
