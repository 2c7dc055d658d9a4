"""Saves killed part way, with real gloo ranks on a real cluster (``ckpt_ranks.py``): the
previous checkpoint stays whole, or the new one is. (A file of their own: pytest-xdist
hands each file to one worker, and these take a minute.)"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from ranks_kit import assert_ok, run_ranks

from graben.store import Client, connect

RANKS = Path(__file__).with_name("ckpt_ranks.py")


@pytest.mark.slow
def test_a_rank_killed_mid_save_leaves_the_previous_checkpoint(cluster_url: str) -> None:
    base = f"/killed-{uuid.uuid4().hex[:8]}"
    url = f"{cluster_url}{base}/ckpt"
    assert_ok(run_ranks(RANKS, "save", url, 2))
    with connect(cluster_url) as client:
        before = _listing(client, f"{base}/ckpt")
    outcomes = run_ranks(RANKS, "die", url, 2)
    assert outcomes[1][0] == 9 and outcomes[0][0] != 0, outcomes[1]
    with connect(cluster_url) as client:
        assert _listing(client, f"{base}/ckpt") == before  # not one file changed
        fresh = f"{base}/never"
    assert_ok(run_ranks(RANKS, "load", url, 2))
    outcomes = run_ranks(RANKS, "die", f"{cluster_url}{fresh}", 2)
    assert outcomes[1][0] == 9
    with connect(cluster_url) as client:
        assert not client.exists(fresh)


@pytest.mark.slow
@pytest.mark.parametrize("step", ["die-staged", "die-before-commit", "die-after-commit"])
def test_a_save_killed_at_each_step_leaves_one_whole_checkpoint(
    cluster_url: str, step: str
) -> None:
    """A rank killed with its files stored and not handed on, the coordinator killed
    before its one commit and after it: the checkpoint is the previous one, untouched
    (or, after the commit, the new one, whole), and a checkpoint never saved before
    is absent (or whole); either way it loads."""
    base = f"/steps-{uuid.uuid4().hex[:8]}"
    url = f"{cluster_url}{base}/ckpt"
    assert_ok(run_ranks(RANKS, "save", url, 2))
    with connect(cluster_url) as client:
        before = _listing(client, f"{base}/ckpt")
    outcomes = run_ranks(RANKS, step, url, 2)
    dead = 1 if step == "die-staged" else 0
    assert outcomes[dead][0] == 9, outcomes
    published = step == "die-after-commit"
    with connect(cluster_url) as client:
        after = _listing(client, f"{base}/ckpt")
        assert (after != before) == published, (before, after)
        assert len(after) == len(before)
    assert_ok(run_ranks(RANKS, "load", url, 2))
    fresh = f"{base}/fresh"
    assert run_ranks(RANKS, step, f"{cluster_url}{fresh}", 2)[dead][0] == 9
    with connect(cluster_url) as client:
        assert client.exists(fresh) == published
    if published:
        assert_ok(run_ranks(RANKS, "load", f"{cluster_url}{fresh}", 2))


def _listing(client: Client, path: str) -> dict[str, tuple[int, int]]:
    out = {}
    for entry in client.ls(path):
        out[entry.path] = (entry.inode, entry.generation)
    return out
