"""The bench's fault workloads: a hung node and the engine's failover, each measured
beside its healthy or bare twin in the same trial (shape only, never timing)."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_kit import quiet_run

from graben.bench._postgres import server_binaries


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_fault_workloads_measure_graben_beside_its_healthy_twin(tmp_path: Path) -> None:
    if server_binaries() is None:
        pytest.skip("PostgreSQL is not installed")
    rows = quiet_run(tmp_path, "cluster-hung-node", "meta-failover", "--quick")
    got = {(r["workload"], r["system"]): r for r in rows}
    hung = "cluster-hung-node"
    healthy = got[hung, "graben, all nodes up"]
    first = got[hung, "graben, one node SIGSTOPped: the first put"]
    after = got[hung, "graben, one node SIGSTOPped: the puts after"]
    assert healthy["ratio"] == 1.0
    assert healthy["value"] > 0 and after["value"] > 0
    # The first put waits out the replica deadline (3 s), never the call timeout (20 s).
    assert 0 < first["value"] < 20
    read = got[hung, "graben, all nodes up: get"]
    first_get = got[hung, "graben, one node SIGSTOPped, read first: a new client's get"]
    assert read["ratio"] == 1.0 and first_get["baseline"] == read["system"]
    assert 0 < first_get["value"] < 20  # the deadline, never a connect timeout per chunk
    failover = "meta-failover"
    engine = got[failover, "PostgreSQL client alone (psycopg, the same URL)"]
    graben = got[failover, "graben cluster, 2 services"]
    assert engine["value"] > 0 and graben["value"] > 0
    assert graben["baseline"] == engine["system"]
    assert got[failover, "acknowledged files lost"]["value"] == 0
    assert not list((tmp_path / "scratch").iterdir())  # the trials' clusters are gone
