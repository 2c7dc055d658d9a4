"""Asynchronous saves in a DDP training loop: a user's loop, with real gloo ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ddp_ranks import STEPS
from ranks_kit import assert_ok, run_ranks

from graben.store import connect

RANKS = Path(__file__).with_name("ddp_ranks.py")


@pytest.mark.parametrize("world", [2, 4])
def test_async_saves_every_step_under_ddp_finish_and_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, world: int
) -> None:
    """The background save's collectives must not meet DDP's all-reduce on one group
    (that hung both ranks on the second step, nothing published)."""
    store = tmp_path / "store"
    monkeypatch.setenv("GRABEN_HOME", str(store))  # graben:/// in the ranks
    outcomes = run_ranks(RANKS, "train", "graben:///runs/ddp", world, timeout=120)
    assert_ok(outcomes)
    for _, out in outcomes:
        got = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
        assert got == {"steps": [STEPS - 2, STEPS - 1], "latest": STEPS - 1, "same": True}
    with connect(store) as client:
        assert [e.name for e in client.ls("/runs/ddp")] == [
            "latest",
            f"step-{STEPS - 2:012d}",
            f"step-{STEPS - 1:012d}",
        ]  # no staging directory left behind
