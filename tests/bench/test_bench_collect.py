"""The bench's collection workloads end to end at a tiny size, the leader's grace shortened
(the bench itself passes none): their rows' shape, never their timing."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from graben.bench import Context, Result, Workload, _collect
from graben.bench._runner import Settings, run

MiB = 1 << 20
GRACE = 1.0

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def _workload(name: str, measure: Callable[..., _collect.Comeback]) -> Workload:
    """``_workloads/collect.py``'s workload with ``grace_s`` (importing that module here
    would register the bench's workloads out of their run order)."""

    def trial(ctx: Context) -> list[Result]:
        return _collect.rows(ctx, name, name, measure(ctx, grace_s=GRACE))

    return Workload(name, name, trial)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_both_report_the_seconds_beside_the_bound_and_the_nodes_beside_du(
    tmp_path: Path,
) -> None:
    workloads = [
        _workload("collect-rm", _collect.after_rm),
        _workload("collect-ckpt", _collect.after_saves),
    ]
    settings = Settings(size=16 * MiB, quick=True, repeat=1)
    outcome = run(workloads, settings, tmp_path, Console(file=io.StringIO()))
    assert outcome.skipped == ()
    for name in ("collect-rm", "collect-ckpt"):
        got = {r.system: r for r in outcome.results if r.workload == name}
        assert got[_collect.BOUND].value == _collect.BOUND_S
        seconds = got[f"space back after {name}: seconds until within 10% of du --physical"]
        assert seconds.baseline == _collect.BOUND and seconds.unit == "s"
        assert 0 < seconds.value < _collect.BOUND_S
        du, nodes = got[_collect.DU], got[_collect.NODES_HOLD]
        assert nodes.baseline == du.system and du.value > 0
        assert nodes.value <= du.value * 1.1
    assert not list((tmp_path / "trials").iterdir())  # the trials' clusters are gone
