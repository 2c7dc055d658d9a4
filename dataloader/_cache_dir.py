"""The way to the node cache's directory, walked safely.

The directory is opened a component at a time from ``/``; every directory on the
way must be its user's or root's (and sticky where others may write), a link is
followed only if its user's or root's, and the cache's own directory is made
0700 and must be a real directory of its user's, writable by no one else
(``graben.store.private_dir`` and its parts, which the memory agent's
directory shares). Whoever controls a step on the way could otherwise point
the cache anywhere.
"""

from __future__ import annotations

import os
from pathlib import Path

from graben.store import cache_home, private_child, trusted_dir

WHAT = "the dataset cache"


def default_dir() -> Path:
    """Where the node cache is when no ``cache_dir`` is given: ``datasets`` in the
    store's cache home (``$XDG_CACHE_HOME/graben``, else ``~/.cache/graben``)."""
    return cache_home() / "datasets"


def open_root(root: Path) -> int:
    """The cache's directory, made if missing, opened and checked, every directory and
    link on the way to it too (``trusted_dir``)."""
    root = Path(os.path.abspath(root))
    if root == Path(os.path.abspath(default_dir())):  # ``graben`` must be ours alone too
        root.parent.parent.mkdir(parents=True, exist_ok=True)
        above = trusted_dir(root.parent.parent, WHAT)
        try:
            graben = private_dir(root.parent.name, root.parent, at=above)
        finally:
            os.close(above)
    else:
        root.parent.mkdir(parents=True, exist_ok=True)
        graben = trusted_dir(root.parent, WHAT)
    try:
        return private_dir(root.name, root, at=graben)
    finally:
        os.close(graben)


def private_dir(path: str | Path, shown: Path, at: int | None = None) -> int:
    """The directory ``path`` (relative to ``at``), made 0700 if missing, opened without
    following a link and checked; an error names it as ``shown``."""
    return private_child(str(path), at, shown, WHAT)
