"""A checkpoint root as the manager lays it out, without torch: step names, ``latest``,
and what ``graben ckpt ls`` lists (the manager's steps and stock DCP checkpoints)."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from graben.store import Client, FileInfo, Held, InvalidArgument, NotFound

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
    tiers: tuple[str, ...] = ("store",)
    """Where it is: ``"store"``, ``"memory"`` (this node's agent), or both."""


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
    tiers: str = "store"
    """Where it is: ``store``, ``memory`` (this node's agent holds every rank's segment),
    ``memory+store``, or ``store, memory 1/2 ranks here`` (a job across hosts)."""


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


JOBS_LOOKED_AT = 200
"""Directories below a folder ``ckpt ls`` looks into for jobs, when it holds none itself."""


def jobs_below(client: Client, root_url: str, root: str) -> list[str]:
    """The jobs right below ``root`` (directories holding a manager's steps or its
    ``latest``): where a folder of jobs sends one who lists it. The first
    ``JOBS_LOOKED_AT`` directories are looked into."""
    try:
        dirs = [e for e in client.ls(root) if e.is_dir][:JOBS_LOOKED_AT]
    except NotFound:
        return []
    base, found = root_url.rstrip("/"), []
    for entry in dirs:
        names = [child.name for child in client.ls(entry.path)]
        if LATEST in names or any(step_of(name) is not None for name in names):
            found.append(f"{base}/{entry.name}")
    return found


def with_memory(rows: list[Listed], held: list[Held], root_url: str) -> list[Listed]:
    """``rows`` with what a memory agent ``held`` of their job: each step's tiers, and the
    steps held only in memory, in step order."""
    ranks: dict[tuple[int, int], set[int]] = {}
    sizes: dict[int, int] = {}
    for h in held:
        if h.complete:
            ranks.setdefault((h.key.step, h.key.world), set()).add(h.key.rank)
            sizes[h.key.step] = sizes.get(h.key.step, 0) + h.size
    memory: dict[int, str] = {}
    for (step, world), present in sorted(ranks.items()):
        whole = len(present) == world
        if whole or step not in memory:
            memory[step] = "memory" if whole else f"memory {len(present)}/{world} ranks here"
    out = []
    for row in rows:
        tier = memory.pop(row.step, None) if row.step is not None else None
        joined = "memory+store" if tier == "memory" else f"store, {tier}" if tier else "store"
        out.append(replace(row, tiers=joined))
    base = root_url.rstrip("/")
    for step, tier in memory.items():
        out.append(Listed(f"{base}/{step_name(step)}", step, 0.0, sizes[step], False, tier))
    return sorted(out, key=lambda r: (r.step is not None, r.step or 0))
