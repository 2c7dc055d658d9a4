"""The bench's tenants workload: a tenant's token and quota beside the cluster's own token,
on one cluster in one run (its shape, and that it leaves no tenant's tree behind)."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_kit import quiet_run

OWN, TENANT = "graben cluster, its own token", "graben cluster, a tenant's token and quota"
"""The rows' systems (not imported: importing a workload module registers the bench's
workloads out of their run order)."""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_tenants_workload_writes_beside_the_clusters_own_token(tmp_path: Path) -> None:
    rows = quiet_run(tmp_path, "tenants", "--quick", "--size", "16M")
    got = {r["system"]: r for r in rows if r["workload"] == "tenants"}
    assert len(got) == 4
    for what in ("4 KiB files", "put"):
        own, tenant = got[f"{OWN}: {what}"], got[f"{TENANT}: {what}"]
        assert own["ratio"] == 1.0 and tenant["baseline"] == own["system"]
        assert tenant["value"] > 0 and own["value"] > 0
