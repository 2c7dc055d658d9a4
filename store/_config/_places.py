"""What a process finds on its own machine: where caches go, the key of chunk files
encrypted at rest, this node's memory agent."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ._env import ENV_AGENT, ENV_ENCRYPTION_KEY_FILE, env

AGENT_PORT = 7300
"""Where a memory agent listens unless told otherwise."""


def agent_address(given: str | None = None) -> str:
    """The memory agent a rank uses: ``given``, else ``$GRABEN_AGENT``, else this host's
    default (``127.0.0.1:7300``)."""
    return given or env(ENV_AGENT) or f"127.0.0.1:{AGENT_PORT}"


def encryption_key_file() -> Path | None:
    """``$GRABEN_ENCRYPTION_KEY_FILE``: the store's key for chunk files encrypted at rest
    (an embedded store's, or a data node's without ``--encryption-key-file``)."""
    found = env(ENV_ENCRYPTION_KEY_FILE)
    return Path(found) if found else None


def cache_home() -> Path:
    """Where graben keeps caches on this machine: ``$XDG_CACHE_HOME/graben`` (an absolute
    ``XDG_CACHE_HOME``), else ``~/.cache/graben``; without a writable home,
    ``$TMPDIR/graben-<uid>``."""
    xdg = env("XDG_CACHE_HOME") or ""
    if os.path.isabs(xdg):
        return Path(xdg) / "graben"
    home = os.path.expanduser("~")
    if os.path.isabs(home) and os.path.isdir(home) and os.access(home, os.W_OK):
        return Path(home) / ".cache" / "graben"
    return Path(tempfile.gettempdir()) / f"graben-{os.geteuid()}"
