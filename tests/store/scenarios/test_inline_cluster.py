"""Small files kept by the metadata engine on a real cluster (SQLite and PostgreSQL):
durable once committed (the service SIGKILLed right after), none on the nodes, and
``--inline-max`` obeyed."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cluster_kit import LocalCluster

from graben.store import connect

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> str | None:
    """The cluster's engine: SQLite in its directory, or a throwaway PostgreSQL database."""
    if request.param == "sqlite":
        return None
    url: str = request.getfixturevalue("pg_url")
    return url


def test_small_files_survive_the_service_killed_and_touch_no_node(
    tmp_path: Path, engine: str | None
) -> None:
    cluster = LocalCluster(tmp_path / "c", nodes=3, engine=engine)
    try:
        files = {f"/run/rank{i:03d}/state.json": b"%d" % i * (i + 1) for i in range(200)}
        with connect(cluster.url) as client, ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda kv: client.put(*kv), files.items()))
        cluster.restart_meta()  # SIGKILL: what was acknowledged must be there
        with connect(cluster.url, timeout=30) as client:
            assert {p: client.get(p) for p in files} == files
            assert client.du("/run") == (200, sum(map(len, files.values())))
            report = client.fsck()
        assert report.ok and report.chunks == 200
        assert [cluster.chunk_files(i) for i in range(3)] == [[], [], []]
    finally:
        cluster.close()


def test_a_service_with_inline_max_0_sends_every_file_to_the_nodes(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "c", nodes=3, meta_args=("--inline-max", "0"))
    try:
        with connect(cluster.url) as client:
            client.put("/tiny", b"t")
            assert client.get("/tiny") == b"t"
        assert sum(len(cluster.chunk_files(i)) for i in range(3)) == 3
    finally:
        cluster.close()
