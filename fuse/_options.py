"""How a store is mounted (no FUSE imports here: the CLI reads it before it needs pyfuse3)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path


def default_spool() -> Path:
    """``$TMPDIR/graben-<uid>/spool``: the user's private graben directory (the
    dataset cache lives beside it), both made 0700 and checked before use."""
    return Path(tempfile.gettempdir()) / f"graben-{os.getuid()}" / "spool"


@dataclass(frozen=True, slots=True, kw_only=True)
class MountOptions:
    """How a store is mounted."""

    read_only: bool = False
    """Refuse every change (``EROFS``)."""
    spool_dir: Path = field(default_factory=default_spool)
    """Where files open for writing are staged until they are committed: a directory
    only this user may write in (made 0700 if missing; default ``$TMPDIR/graben-<uid>/spool``)."""
    spool_limit: int = 16 << 30
    """Bytes the spool may hold; a write past it fails with ``ENOSPC``."""
    timeout: float = 30.0
    """Seconds the kernel may cache attributes and names: the mount follows the store's
    changes and makes it forget others' at once (``_follow``)."""
    wait: float = 1.0
    """Seconds to keep trying to reach a cluster that is starting before the mount fails."""
    log_file: Path | None = None
    """The daemon's log (background mounts; default: ``<spool_dir>/mount.log``)."""
    allow_other: bool = False
    """Let users other than the one mounting in (needs ``user_allow_other`` or root)."""
    log_level: str = "info"
    """Least severe events the daemon logs: ``debug``, ``info``, ``warning`` or ``error``."""
    metrics: str | None = None
    """``HOST:PORT`` to serve Prometheus metrics at ``/metrics`` (port 0: any free one)."""
    token_file: Path | None = None
    """A tenant's token (a 0600 file): the mount reaches what the token does. ``None``:
    ``$GRABEN_TOKEN``, ``$GRABEN_TOKEN_FILE``, else the cluster's secret."""
