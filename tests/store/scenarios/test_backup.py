"""``graben meta backup`` and ``graben meta restore`` on real clusters, SQLite and PostgreSQL.

A backup is taken while the service serves; then files are written, replaced
and deleted, and collection runs with no grace; then the service is stopped,
the backup restored and the service started on it. Every file of the backup
reads back byte for byte (the backup's hold kept the chunks of the deleted and
replaced ones), the files written since are gone, and collection deletes the
chunk files written since (far more than fsck's refusal lets through for a
database that cannot say it was restored) and leaves fsck clean.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cluster_kit import LocalCluster, alive, eventually
from pg_kit import PgServer
from store_kit import SMALL_CHUNK

from graben.store import NotFound, connect

GRABEN = (sys.executable, "-m", "graben.store.cli")
Restore = Callable[[Path], str]
"""Restores a backup file with ``graben meta restore``; the engine it restored into."""


def graben(*args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [*GRABEN, *args], capture_output=True, text=True, timeout=120, check=False, env=env
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _files(prefix: str, count: int) -> dict[str, bytes]:
    return {f"{prefix}{i}": os.urandom(3 * SMALL_CHUNK + i) for i in range(count)}


def back_up_change_restore(
    cluster: LocalCluster, tmp_path: Path, restore: Restore, env: dict[str, str] | None = None
) -> None:
    kept = _files("/keep/f", 3) | {"/doomed/f": os.urandom(2 * SMALL_CHUNK), "/replaced": b"a" * 9}
    kept["/replaced"] = os.urandom(3 * SMALL_CHUNK)
    with connect(cluster.url, chunk_size=SMALL_CHUNK) as client:
        for path, blob in kept.items():
            client.put(path, blob)
        out = tmp_path / "meta.backup"
        said = graben("meta", "backup", "--engine", cluster.engine, str(out), env=env)
        assert "kept until" in said and out.is_file()
        later = _files("/new/f", 10)  # 120 chunk files: past fsck's refusal for orphans
        for path, blob in later.items():
            client.put(path, blob)
        client.rm("/doomed/f")
        client.put("/replaced", os.urandom(SMALL_CHUNK))
        client.fsck(collect=True, grace=0)  # the backup's hold keeps what its files need
    cluster.kill_meta(0)
    engine = restore(out)
    cluster.restart_meta(engine=engine)
    with connect(cluster.url) as client:
        # The restored records say when each node was last heard of before the backup:
        # fsck would skip them as dead until they heartbeat to the restored service.
        eventually(lambda: alive(client) == len(cluster.nodes))
        for path, blob in kept.items():
            assert client.get(path) == blob, path
        with pytest.raises(NotFound):
            client.get("/new/f0")
        report = client.fsck(collect=True, grace=0)
        assert report.collected >= 3 * 3 * len(later), report.problems  # 3+ chunks, 3 copies
        assert client.fsck().ok, client.fsck().problems
        for path, blob in kept.items():
            assert client.get(path) == blob, path


@pytest.fixture(params=["sqlite", "postgresql"])
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LocalCluster]:
    """A 3-node cluster on each engine (PostgreSQL's skips where there is none)."""
    engine = request.getfixturevalue("pg_url") if request.param == "postgresql" else None
    with LocalCluster(tmp_path / "c", nodes=3, timeout=3.0, engine=engine) as cluster:
        yield cluster


def test_a_backup_restores_every_file_and_collection_after_it_is_safe(
    request: pytest.FixtureRequest, cluster: LocalCluster, tmp_path: Path
) -> None:
    if cluster.engine.startswith("sqlite"):
        back_up_change_restore(cluster, tmp_path, lambda backup: _sqlite_restore(cluster, backup))
        assert list((tmp_path / "c").glob("meta.db.replaced-*"))  # set aside, not deleted
        return
    pg_server: PgServer = request.getfixturevalue("pg_server")
    env = {**os.environ, "PATH": f"{pg_server.bindir}:{os.environ['PATH']}"}
    restored = pg_server.create_database()

    def restore(backup: Path) -> str:
        engine = pg_server.url(restored)
        said = graben("meta", "restore", "--engine", engine, str(backup), env=env)
        assert pg_server.password not in said
        return engine

    try:
        back_up_change_restore(cluster, tmp_path, restore, env)
    finally:
        cluster.close()
        pg_server.drop_database(restored)


def _sqlite_restore(cluster: LocalCluster, backup: Path) -> str:
    graben("meta", "restore", "--engine", cluster.engine, "--replace", str(backup))
    return cluster.engine


@pytest.mark.parametrize("cluster", ["sqlite"], indirect=True)
def test_restore_refuses_a_database_that_is_there_without_replace(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    out = tmp_path / "b"
    graben("meta", "backup", "--engine", cluster.engine, str(out))
    done = subprocess.run(
        [*GRABEN, "meta", "restore", "--engine", cluster.engine, str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1 and "--replace" in done.stderr
