"""The bench's storage-class workload: ec:6+3 beside RF=3 on one 9-node cluster, two of
its nodes SIGKILLed for the last read (shape and bytes held, never timing)."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_kit import quiet_run


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_ec_workload_measures_each_figure_beside_rf3(tmp_path: Path) -> None:
    rows = quiet_run(tmp_path, "cluster-ec", "--size", "48M")
    got = {r["system"]: r for r in rows if r["workload"] == "cluster-ec"}
    write, read = got["graben RF=3 write"], got["graben RF=3 warm read"]
    assert write["ratio"] == 1.0 and read["ratio"] == 1.0
    assert got["graben ec:6+3 conversion (background)"]["baseline"] == write["system"]
    for row in ("graben ec:6+3 warm read", "graben ec:6+3 read, 2 nodes SIGKILLed"):
        assert got[row]["baseline"] == read["system"] and got[row]["value"] > 0
    # What the nodes hold per byte is counted, not timed: three copies, and 9 pieces of 6.
    assert got["RF=3: bytes on disk per byte"]["value"] == pytest.approx(3.0, rel=0.01)
    assert got["ec:6+3: bytes on disk per byte"]["value"] == pytest.approx(1.5, rel=0.01)
    assert not list((tmp_path / "scratch").iterdir())  # the trial's cluster is gone
