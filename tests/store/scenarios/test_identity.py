"""A store's identity: a wrong or empty metadata database never wipes the data.

Every store gets an id at creation, kept in its engine and in every data
directory. Nodes refuse a metadata service of another store, a missing
database is created only on request, and collection refuses to delete when
the metadata names far fewer chunks than the nodes hold.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_kit import LocalCluster
from store_kit import SMALL_CHUNK

from graben.store import IntegrityError, Unavailable, connect

GRABEN = (sys.executable, "-m", "graben.store.cli")


def _store_id(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        (found,) = conn.execute("SELECT id FROM store").fetchone()
    conn.close()
    return str(found)


def _chunk_files(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("**/chunks/??/??/*") if p.is_file())


def _eventually(check: object, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "did not happen in time"
        time.sleep(0.2)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path / "c", nodes=3, timeout=3.0)
    try:
        yield cluster
    finally:
        cluster.close()


# -- the id itself ---------------------------------------------------------------------


def test_every_node_records_the_store_id_and_status_shows_it(cluster: LocalCluster) -> None:
    store_id = _store_id(cluster.root / "meta.db")
    assert len(store_id) == 32 and int(store_id, 16)
    ids = [cluster.node_dir(i) / "store-id" for i in range(3)]
    _eventually(lambda: all(p.exists() for p in ids))  # written once the join is answered
    assert {p.read_text().strip() for p in ids} == {store_id}
    with connect(cluster.url) as client:
        assert client.health().store_id == store_id
    done = subprocess.run(
        [*GRABEN, "status", "--store", cluster.url], capture_output=True, text=True, check=False
    )
    assert store_id in done.stdout


def test_an_embedded_store_has_an_id_too(tmp_path: Path) -> None:
    with connect(tmp_path / "s") as client:
        client.put("/a", b"a")
        store_id = client.health().store_id
    assert store_id == _store_id(tmp_path / "s" / "meta.db")
    assert (tmp_path / "s" / "store-id").read_text().strip() == store_id


# -- a cluster on the wrong database ---------------------------------------------------------


def test_meta_serve_will_not_create_a_missing_database(tmp_path: Path) -> None:
    typo = tmp_path / "meta-typo.db"
    done = subprocess.run(
        [*GRABEN, "meta", "serve", "--engine", f"sqlite:///{typo}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 1
    assert "--init" in done.stderr and str(typo) in done.stderr
    assert not typo.exists()


def test_meta_serve_will_not_take_an_empty_database_as_a_new_store(tmp_path: Path) -> None:
    empty = tmp_path / "meta.db"
    empty.write_bytes(b"")
    done = subprocess.run(
        [*GRABEN, "meta", "serve", "--engine", f"sqlite:///{empty}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 1
    assert "--init" in done.stderr
    assert empty.read_bytes() == b""


@pytest.mark.parametrize("wrong", ["typo", "emptied"])
def test_nodes_refuse_a_metadata_service_of_another_store(
    cluster: LocalCluster, tmp_path: Path, wrong: str
) -> None:
    with connect(cluster.url, chunk_size=SMALL_CHUNK) as client:
        for i in range(10):
            client.put(f"/data/{i}", os.urandom(3 * SMALL_CHUNK))
    before = {p: p.read_bytes() for p in _chunk_files(cluster.root)}
    assert len(before) == 90
    if wrong == "typo":  # the operator even said --init
        engine = tmp_path / "meta-typo.db"
    else:  # the right path, emptied (a restore gone wrong)
        engine = cluster.root / "meta.db"
        for suffix in ("", "-wal", "-shm"):
            Path(f"{engine}{suffix}").unlink(missing_ok=True)
        engine.write_bytes(b"")
    cluster.restart_meta(engine=engine)

    with connect(cluster.url, gc_grace_s=0) as client:
        time.sleep(3 * 2.0)  # several heartbeats: every node has tried to join
        assert not [n for n in client.health().nodes if n.alive]
        report = client.fsck(collect=True)
        assert report.collected == 0
    assert {p: p.read_bytes() for p in _chunk_files(cluster.root)} == before


def test_a_node_that_joined_one_store_refuses_another_on_restart(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    with connect(cluster.url) as client:
        client.put("/kept", b"kept" * 1000)
    other = LocalCluster(tmp_path / "other", nodes=1)
    try:
        cluster.kill(0)
        cluster.start_node(0, meta=other.meta_address)
        with connect(other.url) as client:
            time.sleep(3 * 2.0)
            assert [n.alive for n in client.health().nodes].count(True) == 1  # its own only
    finally:
        other.close()
    cluster.kill(0)
    cluster.start_node(0)
    with connect(cluster.url) as client:
        _eventually(lambda: sum(n.alive for n in client.health().nodes) == 3)
        assert client.get("/kept") == b"kept" * 1000


# -- an embedded store on a missing or empty database --------------------------------------


@pytest.mark.parametrize("damage", ["deleted", "zero bytes"])
def test_an_embedded_store_with_chunks_but_no_metadata_is_refused(
    tmp_path: Path, damage: str
) -> None:
    root = tmp_path / "s"
    with connect(root, chunk_size=SMALL_CHUNK) as client:
        for i in range(10):
            client.put(f"/f{i}", os.urandom(3 * SMALL_CHUNK))
    before = {p: p.read_bytes() for p in _chunk_files(root)}
    assert len(before) == 30
    for suffix in ("-wal", "-shm"):
        Path(f"{root / 'meta.db'}{suffix}").unlink(missing_ok=True)
    if damage == "deleted":
        (root / "meta.db").unlink()
    else:
        (root / "meta.db").write_bytes(b"")

    with pytest.raises(IntegrityError, match="metadata database is missing or empty"):
        connect(root, gc_grace_s=0)
    done = subprocess.run(
        [*GRABEN, "fsck", "--collect", "--grace", "0", "--store", str(root)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "missing or empty" in done.stderr
    assert {p: p.read_bytes() for p in _chunk_files(root)} == before
    assert not (root / "meta.db").exists() or (root / "meta.db").stat().st_size == 0


def test_an_embedded_meta_db_of_another_store_is_refused(tmp_path: Path) -> None:
    with connect(tmp_path / "a") as client:
        client.put("/a", b"a" * 10_000)
    with connect(tmp_path / "b") as client:
        client.put("/b", b"b" * 10_000)
    os.replace(tmp_path / "b" / "meta.db", tmp_path / "a" / "meta.db")
    with pytest.raises(IntegrityError, match="another store"):
        connect(tmp_path / "a")


def test_a_new_embedded_store_is_still_made_on_first_use(tmp_path: Path) -> None:
    for root in (tmp_path / "new", tmp_path / "empty-dir"):
        if root.name == "empty-dir":
            root.mkdir()
        with connect(root) as client:
            client.put("/x", b"x")
            assert client.get("/x") == b"x"


# -- collection refuses what looks like the wrong metadata ----------------------------------


def test_collection_refuses_when_most_chunk_files_are_orphans(tmp_path: Path) -> None:
    donor, root = tmp_path / "donor", tmp_path / "s"
    with connect(donor, chunk_size=SMALL_CHUNK) as client:
        client.put("/big", os.urandom(100 * SMALL_CHUNK))
    with connect(root, inline_max=0) as client:  # its one chunk file on the node
        client.put("/small", b"small")
    for path in _chunk_files(donor):  # 100 chunk files no metadata of this store names
        dest = root / path.relative_to(donor)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, dest)
    held = _chunk_files(root)
    with connect(root, gc_grace_s=0) as client:
        with pytest.raises(IntegrityError, match=r"refusing to collect.*100 of 101.*--force"):
            client.fsck(collect=True)
        assert _chunk_files(root) == held
        assert client.fsck(collect=True, force=True).collected == 100
        assert client.get("/small") == b"small"


def test_the_cli_says_why_it_refuses_and_force_overrides(tmp_path: Path) -> None:
    donor, root = tmp_path / "donor", tmp_path / "s"
    with connect(donor, chunk_size=SMALL_CHUNK) as client:
        client.put("/big", os.urandom(100 * SMALL_CHUNK))
    with connect(root, inline_max=0) as client:  # its one chunk file on the node
        client.put("/small", b"small")
    for path in _chunk_files(donor):
        dest = root / path.relative_to(donor)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, dest)
    base = [*GRABEN, "fsck", "--collect", "--grace", "0", "--store", str(root)]
    refused = subprocess.run(base, capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 1
    assert "refusing to collect" in refused.stderr and "--force" in refused.stderr
    assert len(_chunk_files(root)) == 101
    forced = subprocess.run(
        [*base, "--force"], capture_output=True, text=True, timeout=60, check=False
    )
    assert forced.returncode == 0, forced.stderr
    assert len(_chunk_files(root)) == 1


def test_cluster_up_creates_its_store_once_and_restarts_on_it(tmp_path: Path) -> None:
    from graben.store.local import cluster_up

    secret = Path(os.environ["GRABEN_SECRET_FILE"])
    with cluster_up(tmp_path, nodes=1, secret_file=secret) as url, connect(url) as client:
        client.put("/first", b"first")
        first_id = client.health().store_id
    with cluster_up(tmp_path, nodes=1, secret_file=secret) as url, connect(url) as client:
        assert client.get("/first") == b"first"
        assert client.health().store_id == first_id
    (tmp_path / "meta.db").unlink()
    for suffix in ("-wal", "-shm"):
        Path(f"{tmp_path / 'meta.db'}{suffix}").unlink(missing_ok=True)
    with pytest.raises(Unavailable), cluster_up(tmp_path, nodes=1, secret_file=secret):
        pass
    assert not (tmp_path / "meta.db").exists()


def _age(paths: list[Path], seconds: float) -> None:
    past = time.time() - seconds
    for path in paths:
        os.utime(path, (past, past))


def test_another_stores_database_over_a_store_without_its_id_collects_nothing(
    tmp_path: Path,
) -> None:
    """store-id gone, another store's meta.db restored over it: however few the chunk
    files, nothing shows they are that database's, so collection keeps them."""
    root, other = tmp_path / "s", tmp_path / "other"
    with connect(root, chunk_size=SMALL_CHUNK, inline_max=0) as client:
        for i in range(46):
            client.put(f"/f{i}", os.urandom(SMALL_CHUNK))
    with connect(other) as client:
        client.put("/theirs", b"theirs")
    (root / "store-id").unlink()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{root / 'meta.db'}{suffix}").unlink(missing_ok=True)
    os.replace(other / "meta.db", root / "meta.db")
    held = _chunk_files(root)
    _age(held, 2 * 3600)  # older than the default grace
    base = [*GRABEN, "fsck", "--collect", "--store", str(root)]
    refused = subprocess.run(base, capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 1, refused.stdout
    assert "refusing to collect: 46 chunk file(s)" in refused.stderr
    assert "store-id was missing" in refused.stderr and "--force" in refused.stderr
    assert _chunk_files(root) == held
    forced = subprocess.run(
        [*base, "--force"], capture_output=True, text=True, timeout=60, check=False
    )
    assert forced.returncode == 0, forced.stderr
    assert _chunk_files(root) == []
    assert (root / "store-id").read_text() == _store_id(root / "meta.db") + "\n"  # vouched


def test_a_store_made_from_nothing_is_its_chunks_own(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with connect(root, inline_max=0, gc_grace_s=0) as client:
        client.put("/a", b"a" * 5000)
        client.rm("/a")
        assert client.fsck(collect=True).collected == 1  # its own leftovers go
    assert (root / "store-id").read_text().split() == [_store_id(root / "meta.db")]


def test_a_node_that_lost_its_store_id_keeps_its_chunks_from_collection(
    cluster: LocalCluster,
) -> None:
    with connect(cluster.url, inline_max=0) as client:
        client.put("/kept", b"kept" * 1000)
    node = cluster.node_dir(0)
    orphan = node / "chunks" / "ab" / "cd" / ("abcd" + "0" * 60)
    orphan.parent.mkdir(parents=True, exist_ok=True)
    orphan.write_bytes(b"a chunk from before")
    _age([orphan], 2 * 3600)
    cluster.kill(0)
    (node / "store-id").unlink()
    cluster.start_node(0)
    _eventually((node / "store-id").exists)
    assert (node / "store-id").read_text().split()[1:] == ["adopted"]
    with connect(cluster.url) as client:
        with pytest.raises(IntegrityError, match="store-id was missing"):
            client.fsck(collect=True)
        assert orphan.exists()
        assert client.fsck(collect=True, force=True).collected == 1
        assert not orphan.exists()
        assert client.get("/kept") == b"kept" * 1000
    assert (node / "store-id").read_text().split()[1:] == []
