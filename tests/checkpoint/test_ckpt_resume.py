"""Resumes that restore everything: the model, AdamW's state, the LR schedule, the data's
place; and the old pattern (optimizer state dicts taken before the first step) refused."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from agent_kit import Agents
from ranks_kit import assert_ok, run_ranks
from resume_ranks import STEPS, Batches, model
from torch import nn

from graben.checkpoint import CheckpointManager
from graben.store import InvalidArgument

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
RANKS = Path(__file__).with_name("resume_ranks.py")
KILLED = -9
REFUSED = "pass the optimizer itself"


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A job's root URL, on an embedded store of the test's own."""
    monkeypatch.setenv("GRABEN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GRABEN_URL", raising=False)  # graben:/// is that store
    return "graben:///runs/resume"


def job() -> dict[str, Any]:
    """A fresh training job's objects, as a script makes them."""
    net = model()
    optim = torch.optim.AdamW(net.parameters(), lr=0.02, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.StepLR(optim, step_size=2, gamma=0.5)
    return {"model": net, "optim": optim, "sched": sched, "data": Batches(0, 1)}


def train(
    state: dict[str, Any], steps: Iterable[int], ckpt: CheckpointManager | None = None, **save: Any
) -> list[float]:
    """Each step's loss, ``ckpt`` saving ``state`` after each."""
    losses = []
    for step in steps:
        x, y = state["data"].next()
        loss = nn.functional.mse_loss(state["model"](x), y)
        state["optim"].zero_grad()
        loss.backward()
        state["optim"].step()
        state["sched"].step()
        if ckpt is not None:
            ckpt.save(step, state, **save)
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("async_", [False, True])
def test_a_resume_goes_on_with_the_losses_of_an_unbroken_run(root: str, async_: bool) -> None:
    """Model, AdamW, scheduler and a Stateful of the user's own, passed as themselves."""
    reference = train(job(), range(8))
    with CheckpointManager(root, keep_last=None) as ckpt:
        assert ckpt.load_latest(job()) is None  # nothing yet
        state = job()
        assert train(state, range(5), ckpt, async_=async_) == reference[:5]
        ckpt.wait()
        again = job()
        ckpt.load(2, again)  # a step the run went past
        assert train(again, range(3, 8)) == reference[3:]
        again = job()
        assert ckpt.load_latest(again) == 4
        assert again["sched"].last_epoch == 5 and again["optim"].state  # type: ignore[attr-defined]
        assert train(again, range(5, 8)) == reference[5:]


def test_plain_state_dicts_still_load_and_the_old_pattern_is_refused(root: str) -> None:
    state = job()
    with CheckpointManager(root) as ckpt:
        train(state, range(2), ckpt)
        assert ckpt.load_latest({"model": model().state_dict()}) == 1  # a part, as before
        fresh = job()
        old = {"model": fresh["model"].state_dict(), "optim": fresh["optim"].state_dict()}
        with pytest.raises(InvalidArgument, match=REFUSED) as refused:
            ckpt.load_latest(old)  # its "state" is {}: AdamW's state had nowhere to go
        assert "\n" not in str(refused.value) and "'optim'" in str(refused.value)
        plain = {"model": state["model"].state_dict(), "optim": state["optim"].state_dict()}
        ckpt.save(2, plain)  # the optimizer's state by parameter number, as DCP saves it
        assert ckpt.load_latest(plain) == 2  # taken after a step: it has a place for all
        with pytest.raises(InvalidArgument, match=REFUSED):
            ckpt.load_latest(old)


def test_a_checkpoint_of_the_old_pattern_says_it_holds_no_optimizer_state(root: str) -> None:
    state = job()
    old = {"model": state["model"].state_dict(), "optim": state["optim"].state_dict()}
    old["sched"] = state["sched"]
    with CheckpointManager(root) as ckpt:
        train(state, range(2))
        ckpt.save(1, old)  # the optimizer's state_dict() before its first step: no state
        with pytest.raises(InvalidArgument, match="holds no optimizer state") as refused:
            fresh = job()
            del fresh["data"]
            ckpt.load_latest(fresh)  # not DCP's "Missing key" from every rank
        assert "resume without 'optim'" in str(refused.value)
        assert ckpt.load_latest({"model": model(), "sched": job()["sched"]}) == 1


def test_an_optimizer_needs_its_model_in_the_state_dict(root: str) -> None:
    state = job()
    train(state, range(1))
    with CheckpointManager(root) as ckpt:
        with pytest.raises(InvalidArgument, match="no module"):
            ckpt.save(1, {"optim": state["optim"]})
        assert ckpt.list() == []


@pytest.fixture
def agent() -> Iterator[str]:
    with Agents() as agents:
        yield agents.start("a")


@pytest.mark.slow
def test_the_memory_tier_restores_everything_and_refuses_the_old_pattern(
    root: str, agent: str, caplog: pytest.LogCaptureFixture
) -> None:
    reference = train(job(), range(6))
    url = f"{root}-{uuid.uuid4().hex[:8]}"  # a job's steps at the agent are named by it
    with CheckpointManager(url, tiers=("memory", "store"), store_every=100, agent=agent) as ckpt:
        assert train(job(), range(4), ckpt, async_=True) == reference[:4]
    with CheckpointManager(url, tiers=("memory", "store"), agent=agent) as ckpt:
        again = job()
        assert ckpt.load_latest(again) == 3  # from memory: the store holds step 0 only
        assert train(again, range(4, 6)) == reference[4:]
        fresh = job()
        old = {"model": fresh["model"].state_dict(), "optim": fresh["optim"].state_dict()}
        with caplog.at_level(logging.WARNING), pytest.raises(InvalidArgument, match=REFUSED):
            ckpt.load_latest(old)
    refusals = [r.getMessage() for r in caplog.records if REFUSED in r.getMessage()]
    assert refusals and "step 3 is not loaded from memory" in refusals[0]  # then the store's


def said(outcomes: list[tuple[int, str]]) -> list[list[dict[str, Any]]]:
    """Each rank's JSON lines."""
    return [[json.loads(x) for x in out.splitlines() if x.startswith("{")] for _, out in outcomes]


def losses(outcomes: list[tuple[int, str]]) -> tuple[int | None, dict[int, float]]:
    """Where the ranks resumed, and each step's loss (the same on every rank)."""
    ranks = said(outcomes)
    resumed = {lines[0]["resumed"] for lines in ranks}
    by_step = [{s["step"]: s["loss"] for s in lines if "step" in s} for lines in ranks]
    assert len(resumed) == 1 and all(b == by_step[0] for b in by_step), ranks
    return resumed.pop(), by_step[0]


@pytest.mark.slow
def test_ddp_killed_resumed_on_2_ranks_then_on_1_goes_on_with_the_same_losses(
    cluster_url: str,
) -> None:
    """AdamW under DDP on 2 gloo ranks, saved every step asynchronously; SIGKILLed after
    step 3, resumed on 2 ranks, SIGKILLed after step 7, resumed on 1 rank to the end."""
    base = f"{cluster_url}/resume-{uuid.uuid4().hex[:8]}"
    whole = run_ranks(RANKS, "train", f"{base}/whole", 2)
    assert_ok(whole)
    _, reference = losses(whole)
    assert sorted(reference) == list(range(STEPS))
    url = f"{base}/killed"

    first = run_ranks(RANKS, "train-die-3", url, 2)
    assert [code for code, _ in first] == [KILLED, KILLED], first
    assert losses(first) == (None, {s: reference[s] for s in range(4)})

    second = run_ranks(RANKS, "train-die-7", url, 2)
    assert [code for code, _ in second] == [KILLED, KILLED], second
    resumed, got = losses(second)
    assert resumed in (2, 3)  # the save of step 3 may have died with its ranks
    assert got == {s: reference[s] for s in range(resumed + 1, 8)}  # bit for bit

    third = run_ranks(RANKS, "train", url, 1)
    assert_ok(third)
    resumed, got = losses(third)
    assert resumed in (6, 7)
    # one rank sums the gradient of all 32 rows in another order than two ranks' 16 each
    assert got == pytest.approx({s: reference[s] for s in range(resumed + 1, STEPS)}, rel=1e-5)

    old = run_ranks(RANKS, "old", url, 1)
    assert_ok(old)
    assert REFUSED in said(old)[0][0]["refused"]
