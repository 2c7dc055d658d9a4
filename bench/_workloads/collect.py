"""Collection: space comes back by itself, with default settings and no command.

Issue 51's figure: after ``rm -r`` of ``--size`` bytes (1 GiB in the issue), or 30
saves with ``keep_last=3``, the nodes' chunk bytes come within 10% of ``graben du
--physical`` within 5 minutes. Each workload starts a 3-node cluster of its own
(``_collect``) and reports the seconds beside that bound, and the nodes' chunk bytes
at the end beside ``du --physical``. The leader's default grace is 120 s, so each
takes over two minutes whatever ``--size``; neither is in ``make run``.
"""

from __future__ import annotations

from .. import _collect
from .._context import Context
from .._registry import Result, Skip, workload

MiB = 1 << 20


@workload("collect-rm", "rm -r of --size bytes: seconds until the nodes hold what du counts")
def collect_rm(ctx: Context) -> list[Result]:
    """The tree's space back after ``rm -r``, default settings."""
    _own_cluster_only(ctx)
    back = _collect.after_rm(ctx)
    return _collect.rows(ctx, "collect-rm", f"rm -r of {ctx.size / MiB:.0f} MiB", back)


@workload(
    "collect-ckpt", "30 saves of 4 MiB, keep_last=3: seconds until the nodes hold what du counts"
)
def collect_ckpt(ctx: Context) -> list[Result]:
    """The rotated checkpoints' space back after the last save, default settings."""
    _own_cluster_only(ctx)
    back = _collect.after_saves(ctx)
    saves = f"{_collect.SAVES} saves, keep_last={_collect.KEEP_LAST}"
    return _collect.rows(ctx, "collect-ckpt", saves, back)


def _own_cluster_only(ctx: Context) -> None:
    if ctx.target is not None:
        raise Skip("--target: the bench reads the data directories of a cluster of its own")
