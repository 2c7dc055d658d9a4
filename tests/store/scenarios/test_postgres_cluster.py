"""``graben meta serve --engine postgresql://...``: real processes on a real PostgreSQL.

A metadata service on PostgreSQL with three data nodes serves what it
serves on SQLite; a second service on the same database serves the same
store; a database without a store is refused unless ``--init`` is given.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cluster_kit import LocalCluster
from pg_kit import PgServer
from store_kit import SMALL_CHUNK

from graben.store import NotFound, Unavailable, connect, local
from graben.store._types import DAMAGE
from graben.store.meta.engines._postgres_url import display_url

GRABEN = (sys.executable, "-m", "graben.store.cli")


def _serve(engine: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GRABEN, "meta", "serve", "--engine", engine, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def cluster(tmp_path: Path, pg_url: str) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path / "c", nodes=3, timeout=3.0, engine=pg_url)
    try:
        yield cluster
    finally:
        cluster.close()


def test_a_database_without_a_store_is_refused_without_init(
    pg_server: PgServer, pg_database: str, pg_url: str
) -> None:
    done = _serve(pg_url)
    assert done.returncode == 1
    assert "--init" in done.stderr and display_url(pg_url) in done.stderr
    assert pg_server.password not in done.stderr
    assert pg_server.sql(pg_database, "SELECT COUNT(*) FROM pg_tables WHERE schemaname = 'public'")[
        0
    ] == (0,)


def test_a_missing_database_is_refused_without_init(pg_server: PgServer) -> None:
    typo = pg_server.url("graben_typo")
    done = _serve(typo)
    assert done.returncode == 1
    assert "does not exist" in done.stderr and "--init" in done.stderr
    assert display_url(typo) in done.stderr and pg_server.password not in done.stderr
    assert not pg_server.sql("postgres", "SELECT 1 FROM pg_database WHERE datname = 'graben_typo'")


def test_an_unknown_engine_names_both_kinds(tmp_path: Path) -> None:
    done = _serve("mysql://meta@db/graben")
    assert done.returncode == 1
    assert "sqlite:///" in done.stderr and "postgresql://" in done.stderr


def test_without_psycopg_meta_serve_says_what_to_install(tmp_path: Path) -> None:
    # psycopg is optional: the store and its command line import without it.
    hide = "import sys; sys.modules['psycopg'] = sys.modules['psycopg_pool'] = None; "
    run = "from graben.store.cli import main; sys.exit(main(sys.argv[1:]))"
    secret = local.make_secret_file(tmp_path / "secret")
    engine = "postgresql://graben@127.0.0.1:1/graben"
    done = subprocess.run(
        [
            *(sys.executable, "-c", hide + run),
            *("meta", "serve", "--engine", engine, "--secret-file", str(secret)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "pip install 'graben[postgres]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_cluster_on_postgresql_serves_every_operation(
    cluster: LocalCluster, pg_server: PgServer, pg_database: str
) -> None:
    data = {f"/d/f{i}": os.urandom(3 * SMALL_CHUNK + i) for i in range(5)}
    with connect(cluster.url, chunk_size=SMALL_CHUNK, gc_grace_s=0) as client:
        for path, blob in data.items():
            client.put(path, blob)
        assert [i.name for i in client.ls("/d")] == [f"f{i}" for i in range(5)]
        assert client.get("/d/f3") == data["/d/f3"]
        client.rename("/d/f0", "/e/moved")
        assert client.get("/e/moved") == data["/d/f0"]
        client.rm("/d/f1")
        with pytest.raises(NotFound):
            client.get("/d/f1")
        assert client.du("/") == (4, sum(len(b) for p, b in data.items() if p != "/d/f1"))
        report = client.fsck(collect=True, grace=0)
        assert not [p for p in report.problems if p.kind != "unreferenced"], report.problems
        assert report.collected >= 4  # /d/f1's chunks, at three copies
        (store_id,) = pg_server.sql(pg_database, "SELECT id FROM store")[0]
        assert client.health().store_id == store_id
    cluster.restart_meta()  # the store lives in PostgreSQL, not in the process
    with connect(cluster.url) as client:
        assert client.get("/d/f4") == data["/d/f4"]
        assert client.fsck().ok


def test_two_metadata_services_serve_one_store(cluster: LocalCluster) -> None:
    second, address = local.spawn(
        *("meta", "serve", "--engine", cluster.engine, "--replication", "3"),
        *("--listen", "127.0.0.1:0"),
    )
    try:
        with (
            connect(cluster.url, chunk_size=SMALL_CHUNK) as one,
            connect(f"graben://{address}", chunk_size=SMALL_CHUNK) as two,
        ):
            assert sum(n.alive for n in two.health().nodes) == 3  # registered by the first
            blob = os.urandom(5 * SMALL_CHUNK)
            one.put("/shared/a", blob)
            assert two.get("/shared/a") == blob
            two.put("/shared/b", blob[::-1])
            two.rename("/shared/a", "/shared/c")
            assert [i.name for i in one.ls("/shared")] == ["b", "c"]
            assert one.get("/shared/b") == blob[::-1]
            assert one.health().store_id == two.health().store_id
            assert two.fsck().ok
    finally:
        local.stop([second])


def test_puts_through_a_postgresql_restart_are_whole_or_refused(
    cluster: LocalCluster, pg_server: PgServer
) -> None:
    stored: dict[str, bytes] = {}
    refused: dict[str, bytes] = {}
    stop = threading.Event()

    def writer(worker: int) -> None:
        with connect(cluster.url, chunk_size=SMALL_CHUNK) as client:
            i = 0
            while not stop.is_set():
                path, blob = f"/w{worker}/f{i}", os.urandom(2 * SMALL_CHUNK + i)
                try:
                    client.put(path, blob)
                    stored[path] = blob
                except Unavailable:
                    refused[path] = blob
                i += 1

    with ThreadPoolExecutor(4) as pool:
        running = [pool.submit(writer, w) for w in range(4)]
        time.sleep(1.0)
        pg_server.restart()
        time.sleep(1.0)
        stop.set()
        for future in running:
            future.result()  # anything but Unavailable fails the test here
    assert stored
    with connect(cluster.url) as client:
        for path, blob in stored.items():
            assert client.get(path) == blob
        for path, blob in refused.items():  # the commit got through before the cut, or not
            if client.exists(path):
                assert client.get(path) == blob
        report = client.fsck()
        assert not [p for p in report.problems if p.kind in DAMAGE], report.problems
        client.put("/after", b"served again")
