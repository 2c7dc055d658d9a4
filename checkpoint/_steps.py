"""A checkpoint root as the manager lays it out, without torch: step names, ``latest``,
and what ``graben ckpt ls`` lists (the manager's steps and stock DCP checkpoints)."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass

from graben.store import Client, FileInfo, InvalidArgument, NotFound

from ._storage import METADATA

LATEST = "latest"
"""The file under a root naming its newest complete step."""
STEP = re.compile(r"step-(\d{12})")


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """One complete checkpoint under a manager's root."""

    step: int
    """The training step it was saved at."""
    url: str
    """Its URL (what ``GrabenReader`` or ``dcp.load`` takes)."""
    mtime: float
    """When it was published, seconds since the epoch."""


def step_name(step: int) -> str:
    """The directory of checkpoint ``step`` under its root."""
    if step < 0:
        raise InvalidArgument(f"a step is a non-negative integer, not {step}")
    return f"step-{step:012d}"


def step_of(name: str) -> int | None:
    """The step a directory name holds (``None``: not a step's)."""
    match = STEP.fullmatch(name)
    return int(match.group(1)) if match else None


def checkpoint_steps(entries: Iterable[FileInfo]) -> list[str]:
    """The names of the complete checkpoints among a root's entries, oldest first."""
    return sorted(e.name for e in entries if e.is_dir and STEP.fullmatch(e.name))


@dataclass(frozen=True, slots=True)
class Listed:
    """One row of ``graben ckpt ls``."""

    url: str
    """The checkpoint's URL."""
    step: int | None
    """Its step (``None``: a stock ``dcp.save`` checkpoint, named as its saver chose)."""
    published: float
    """When it was published, seconds since the epoch."""
    bytes: int
    """Bytes of its files."""
    latest: bool
    """Whether the root's ``latest`` names it."""


def listing(client: Client, root_url: str, root: str) -> list[Listed]:
    """The checkpoints under ``root``: the manager's steps (oldest first), then any other
    directory holding a DCP ``.metadata`` (``dcp.save`` to a name of its own), and the
    root itself if it is one."""
    try:
        entries = client.ls(root)  # sorted by name: steps, zero-padded, in step order
    except NotFound:
        return []
    try:
        latest = client.get(posixpath.join(root, LATEST)).decode()
    except NotFound:
        latest = ""
    steps = [e for e in entries if e.is_dir and step_of(e.name) is not None]
    others = [e for e in entries if e.is_dir and step_of(e.name) is None]
    stock = [e for e in others if client.exists(posixpath.join(e.path, METADATA))]
    if client.exists(posixpath.join(root, METADATA)):
        stock.insert(0, client.stat(root))
    base = root_url.rstrip("/")
    return [
        Listed(
            base if e.path == root else f"{base}/{e.name}",
            step_of(e.name) if e.path != root else None,
            e.mtime_ns / 1e9,
            client.du(e.path)[1],
            e.path != root and e.name == latest,
        )
        for e in steps + stock
    ]
