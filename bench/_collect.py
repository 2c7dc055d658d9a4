"""Space coming back by itself, measured: issue 51's figure on a cluster of its own.

A 3-node loopback cluster started by ``graben cluster up`` with its default settings
(no ``--collect-grace``, no ``--collect-per-round``: the leader's 120 s and 1000
chunks, a round every 5 s), unless a caller passes ``grace_s`` (the tests do, to be
quick). Then either a tree removed with ``rm -r`` or 30 checkpoint saves rotated by
``keep_last=3``, and the seconds until the nodes' chunk files come within 10% of
what ``graben du --physical /`` counts, polled every second.

The tree's store keeps one small file beside it (``KEPT``), so the target is not
0 bytes; its copies (3 x 4 MiB) are smaller than one chunk of the tree (8 MiB by
default), so "within 10%" means every copy of the tree gone. The checkpoints'
target is what the last three saves hold.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from graben.checkpoint import CheckpointManager
from graben.store import connect
from graben.store.cli._trees import physical as du_physical
from graben.store.local import cluster_up, make_secret_file

from ._context import Context
from ._kit import environ, random_data
from ._registry import Result

MiB = 1 << 20
NODES = 3
MARGIN = 0.1
"""The nodes' chunk bytes count as back once at most this much above ``du --physical``."""
BOUND_S = 300.0
"""Issue 51's bound: space back within 5 minutes."""
LIMIT_S = BOUND_S + 60.0
"""How long a trial waits before it reports the space not back."""
POLL_S = 1.0
BOUND = "issue 51's bound"
DU = "graben du --physical at the end"
NODES_HOLD = "the nodes' chunk files at the end"
FILE = 32 * MiB
"""Bytes per file of the tree (the last one takes what is left)."""
KEPT = 4 * MiB
"""The file kept beside the tree."""
SAVES, KEEP_LAST = 30, 3
MODEL = (1024, 1024)
"""The saved model: one float32 tensor of 4 MiB, new bytes each save."""


@dataclass(frozen=True, slots=True)
class Comeback:
    """How long a cluster's nodes took to give back what no file uses any more."""

    seconds: float
    """From the ``rm -r`` (or the end of the last save) until the nodes' chunk bytes were
    within ``MARGIN`` of ``du --physical``; if never, how long the trial waited."""
    reached: bool
    """Whether they came within ``MARGIN`` before ``LIMIT_S``."""
    before: int
    """The nodes' chunk bytes just before the removal (or after the last save)."""
    nodes: int
    """The nodes' chunk bytes at the end."""
    physical: int
    """What ``graben du --physical /`` counted at the end."""


def node_bytes(root: Path) -> int:
    """Bytes of the chunk files in the data directories under ``root`` (apparent sizes, as
    ``du --apparent-size`` counts them; the nodes' temporaries aside)."""
    total = 0
    for path in root.glob("node*/chunks/??/??/*"):
        with contextlib.suppress(FileNotFoundError):  # collected as we looked
            total += path.stat().st_size
    return total


@contextmanager
def own_cluster(root: Path, grace_s: float | None = None) -> Iterator[str]:
    """``graben cluster up`` with 3 nodes in ``root``, default settings unless ``grace_s``
    (its ``--collect-grace``); the secret in ``$GRABEN_SECRET_FILE`` meanwhile. Its URL."""
    root.mkdir(parents=True, exist_ok=True)
    secret = make_secret_file(root / "secret")
    extra = () if grace_s is None else ("--collect-grace", f"{grace_s:g}")
    with (
        environ({"GRABEN_SECRET_FILE": str(secret)}),
        cluster_up(root, NODES, secret, extra=extra) as url,
    ):
        yield url


def wait_until_back(root: Path, url: str, started: float, before: int) -> Comeback:
    """Poll the nodes until their chunk bytes are within ``MARGIN`` of ``du --physical``
    (counted once now: no file changes meanwhile), or ``LIMIT_S`` after ``started``."""
    with connect(url) as client:
        want = du_physical(client, "/")[0]
        reached = False
        while time.monotonic() - started < LIMIT_S:
            if node_bytes(root) <= want * (1 + MARGIN):
                reached = True
                break
            time.sleep(POLL_S)
        seconds = time.monotonic() - started
        held = du_physical(client, "/")[0]
    return Comeback(seconds, reached, before, node_bytes(root), held)


def after_rm(ctx: Context, grace_s: float | None = None) -> Comeback:
    """Put ``ctx.size`` bytes as a tree of files beside a small one, ``rm -r`` the tree,
    and wait for the space to come back."""
    data = ctx.fixture(random_data)
    root = ctx.scratch / "collect-rm"
    with own_cluster(root, grace_s) as url, connect(url) as client:
        client.put("/kept", os.urandom(KEPT))
        with memoryview(data) as view, ctx.step("collect: the tree", ctx.size) as tick:
            for i, start in enumerate(range(0, ctx.size, FILE)):
                piece = view[start : min(start + FILE, ctx.size)]
                client.put(f"/tree/{i % 8}/f{i}", piece)
                tick(piece.nbytes)
                piece.release()
        before = node_bytes(root)
        started = time.monotonic()
        client.rm("/tree", recursive=True)
        with ctx.step("collect: waiting for the space after rm -r", int(BOUND_S)):
            return wait_until_back(root, url, started, before)


def after_saves(ctx: Context, grace_s: float | None = None) -> Comeback:
    """Save a 4 MiB model 30 times with ``keep_last=3``, and wait for the space of the 27
    rotated out to come back."""
    root = ctx.scratch / "collect-ckpt"
    with own_cluster(root, grace_s) as url:
        with (
            CheckpointManager(f"{url}/runs/collect", keep_last=KEEP_LAST) as manager,
            ctx.step(f"collect: {SAVES} saves", SAVES) as tick,
        ):
            for step in range(SAVES):
                manager.save(step, {"w": torch.randn(*MODEL), "step": step})
                tick(1)
        started = time.monotonic()
        with ctx.step("collect: waiting for the space after the saves", int(BOUND_S)):
            return wait_until_back(root, url, started, node_bytes(root))


def rows(ctx: Context, name: str, what: str, back: Comeback) -> list[Result]:
    """The seconds beside the bound; the nodes' bytes beside ``du --physical``."""
    margin = f"{MARGIN:.0%}"
    ctx.console.print(
        f"{name}: nodes held {back.before / MiB:.0f} MiB before, {back.nodes / MiB:.1f} MiB "
        f"after {back.seconds:.0f} s; du --physical {back.physical / MiB:.1f} MiB"
        + ("" if back.reached else f": NOT within {margin}")
    )
    seconds = (
        f"space back after {what}: seconds until within {margin} of du --physical"
        if back.reached
        else f"space back after {what}: not within {margin} after {back.seconds:.0f} s"
    )
    return [
        Result(name, BOUND, BOUND_S, "s", BOUND),
        Result(name, seconds, back.seconds, "s", BOUND),
        Result(name, DU, back.physical / MiB, "MiB", DU),
        Result(name, NODES_HOLD, back.nodes / MiB, "MiB", DU),
    ]
