"""The memory tier's workloads, tiny: a real cluster, a real agent, 2 real ranks."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_kit import quiet_run

from graben.bench import discover


@pytest.mark.slow
def test_the_memory_tier_is_measured_beside_copy_the_store_and_a_bare_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every row, each beside its baseline; the load job checks every value it reads back,
    from memory and from the store, and the agent's directory is gone afterwards."""
    discover()  # importing a workload module first would register its workloads out of order
    from graben.bench._workloads import memory

    monkeypatch.setattr(memory, "QUICK_STEPS", 5)
    before = set(Path("/dev/shm").glob("graben-bench-*"))
    rows = quiet_run(tmp_path, "ckpt-memory", "ckpt-memory-loop", "--size-mib", "16", "--quick")
    got = {(r["workload"], r["system"]): (r["value"], r["baseline"]) for r in rows}
    assert got[("ckpt-memory", memory.COPY)][1] == memory.COPY
    assert got[("ckpt-memory", "save into the memory tier, 2 ranks: blocked")][1] == memory.COPY
    assert got[("ckpt-memory", "load_latest from the memory tier, new processes")][0] > 0
    assert got[("ckpt-memory", memory.READER)][0] > 0
    loop = [v for (w, _), (v, _) in got.items() if w == "ckpt-memory-loop"]
    assert len(loop) == 3 and all(v > 0 for v in loop)
    assert set(Path("/dev/shm").glob("graben-bench-*")) == before


@pytest.mark.slow
def test_many_ranks_save_into_eight_agents_and_every_step_is_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The many-ranks workload, small: every rank's save is held at its agent (the step
    is seen there after each save), each blocked time sits beside the copy_ rows, the
    agents held every rank's segments and their peers' copies, and none is left."""
    discover()
    from graben.bench import _memory_ranks
    from graben.bench._workloads import memory

    monkeypatch.setattr(memory, "MEMORY_RANKS", {True: (32, 256 << 10)})
    monkeypatch.setattr(_memory_ranks, "STEP_S", 0.2)
    before = set(Path("/dev/shm").glob("graben-bench-*"))
    rows = quiet_run(tmp_path, "ckpt-memory-ranks", "--quick")
    got = {r["system"]: (r["value"], r["baseline"]) for r in rows}
    copy_p99 = "plain copy_ of the same tensors, 32 ranks: p99"
    blocked, base = got["save into the memory tier, 32 ranks: blocked, p99"]
    assert base == copy_p99 and blocked > got[copy_p99][0] > 0
    held = got["32 ranks: first rank's save to the step held by all"][0]
    assert held >= got["32 ranks: last rank's save to the step held by all"][0] >= 0
    assert got["8 agents together: CPU per step"][0] > 0
    assert 0 < got["32 ranks: CPU per rank and save"][0] < 1000
    assert set(Path("/dev/shm").glob("graben-bench-*")) == before


def test_the_many_ranks_figures_are_taken_per_rank_and_step() -> None:
    """The outcome's arithmetic: p99, the bound per rank, held after the first and last."""
    from graben.bench._memory_ranks import _outcome

    copies = [[0.010, 0.001], [0.010, 0.001]]
    timings = [[(1.0, 1.015, 1.02), (1.005, 1.03, 1.04)], [(2.0, 2.05, 2.06), (2.0, 2.01, 2.02)]]
    out = _outcome(2, 1 << 20, copies, timings, (4.0, 0.002), 10, 20)
    # rank 0: bound 40 ms, blocked 15 and 50 ms; rank 1: bound 22 ms, blocked 25 and 10 ms
    assert out.over_bound == 2
    assert out.blocked_p99 == pytest.approx(0.050)
    assert out.first_to_held == pytest.approx((0.04 + 0.06) / 2)
    assert out.last_to_held == pytest.approx((0.035 + 0.06) / 2)
    assert (out.agents_cpu_per_step, out.rank_cpu_per_save) == (2.0, 0.0005)
