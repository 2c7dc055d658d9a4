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
