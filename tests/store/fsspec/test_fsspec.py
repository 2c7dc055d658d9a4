"""``graben://`` through fsspec, as pandas, pyarrow and torch DCP users reach it."""

from __future__ import annotations

import importlib.metadata
import os
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from ranks_kit import assert_ok, run_ranks

from graben.store import Client, GrabenFileSystem, connect

MIB = 1024 * 1024
DCP_RANKS = Path(__file__).with_name("dcp_ranks.py")


@pytest.fixture(params=["embedded", "cluster"])
def base(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """A fresh directory URL: ``graben:///...`` on the default (embedded) store, or a cluster's."""
    name = f"fsspec-{uuid.uuid4().hex[:8]}"
    if request.param == "embedded":
        monkeypatch.setenv("GRABEN_HOME", str(tmp_path / "home"))
        monkeypatch.delenv("GRABEN_URL", raising=False)
        url = f"graben:///{name}"
    else:
        url = f"{request.getfixturevalue('cluster_url')}/{name}"
    GrabenFileSystem.clear_instance_cache()
    yield url
    for fs in list(GrabenFileSystem._cache.values()):
        fs.client.close()
    GrabenFileSystem.clear_instance_cache()


def _fs(url: str) -> tuple[GrabenFileSystem, str]:
    fs, path = fsspec.core.url_to_fs(url)
    assert isinstance(fs, GrabenFileSystem)
    return fs, path


def test_registered_by_entry_point() -> None:
    names = {e.name: e.value for e in importlib.metadata.entry_points(group="fsspec.specs")}
    assert names["graben"] == "graben.store:GrabenFileSystem"
    assert fsspec.get_filesystem_class("graben") is GrabenFileSystem


def test_urls_name_the_store_and_the_path(cluster_url: str) -> None:
    fs, path = _fs(f"{cluster_url}/a/b.bin")
    try:
        # the cluster stays in fsspec's form of the path, as an S3 bucket does
        assert path == f"{cluster_url.removeprefix('graben://')}/a/b.bin"
        assert fs.url == cluster_url
        assert fs.unstrip_protocol(path) == f"{cluster_url}/a/b.bin"
        assert fs.unstrip_protocol("/a/b.bin") == f"{cluster_url}/a/b.bin"
        assert f"graben://{path}" == f"{cluster_url}/a/b.bin"
        assert GrabenFileSystem._strip_protocol("graben:///x/y/") == "/x/y"
        assert GrabenFileSystem._get_kwargs_from_urls("graben:///x") == {}
        # the same cluster from two URLs is one instance (one client, one connection pool)
        again, _ = _fs(f"{cluster_url}/elsewhere")
        assert again is fs
    finally:
        fs.client.close()
        GrabenFileSystem.clear_instance_cache()


def test_default_store_is_graben_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRABEN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GRABEN_URL", raising=False)
    GrabenFileSystem.clear_instance_cache()
    with fsspec.open("graben:///d/hello.txt", "wb") as f:
        f.write(b"hello")
    fs, _ = _fs("graben:///")
    fs.client.close()
    GrabenFileSystem.clear_instance_cache()
    with connect(tmp_path / "home") as client:
        assert client.get("/d/hello.txt") == b"hello"


def test_cat_pipe_ranges_and_info(base: str) -> None:
    fs, root = _fs(base)
    data = os.urandom(3 * MIB + 17)
    fs.pipe_file(f"{root}/blob", data)
    assert fs.cat_file(f"{root}/blob") == data
    assert fs.cat_file(f"{root}/blob", 5, 4 * MIB) == data[5:]
    assert fs.cat_file(f"{root}/blob", -100) == data[-100:]
    assert fs.cat_file(f"{root}/blob", 10, -10) == data[10:-10]
    assert fs.cat_file(f"{root}/blob", MIB, MIB + 3) == data[MIB : MIB + 3]
    info = fs.info(f"{root}/blob")
    assert (info["name"], info["size"], info["type"]) == (f"{root}/blob", len(data), "file")
    assert fs.ls(root, detail=False) == [f"{root}/blob"]
    assert fs.modified(f"{root}/blob").timestamp() == pytest.approx(info["mtime"])
    with pytest.raises(FileExistsError):
        fs.pipe_file(f"{root}/blob", b"x", mode="create")
    assert fs.cat_file(f"{root}/blob") == data


def test_errors_are_the_builtins_fsspec_users_catch(base: str) -> None:
    fs, root = _fs(base)
    fs.pipe_file(f"{root}/d/f", b"x")
    with pytest.raises(FileNotFoundError):
        fs.cat_file(f"{root}/missing")
    with pytest.raises(FileNotFoundError):
        fs.info(f"{root}/missing")
    with pytest.raises(IsADirectoryError):
        fs.cat_file(f"{root}/d")
    with pytest.raises(NotADirectoryError):
        fs.pipe_file(f"{root}/d/f/g", b"x")
    with pytest.raises(FileExistsError):
        fs.makedirs(f"{root}/d")
    with pytest.raises(OSError, match="not empty"):
        fs.rm(f"{root}/d")
    with pytest.raises(ValueError, match=r"'ab'"):
        fs.open(f"{root}/d/f", "ab")
    with pytest.raises(ValueError, match=r"\.\."):  # a hostile path: refused, nothing written
        fs.pipe_file(f"{root}/../../etc/passwd", b"x")
    assert not fs.exists("/etc/passwd")
    fs.rm(f"{root}/d", recursive=True)
    assert not fs.exists(f"{root}/d")


def test_put_get_large_files_in_parts(base: str, tmp_path: Path) -> None:
    fs, root = _fs(base)
    src = tmp_path / "src.bin"
    data = os.urandom(fs.client.chunk_size * 2 + 12345)
    src.write_bytes(data)
    seen: list[int] = []

    class Count(fsspec.callbacks.Callback):  # type: ignore[misc]
        def call(self, *args: object, **kwargs: object) -> None:
            seen.append(self.value)

    fs.put_file(str(src), f"{root}/big.bin", callback=Count())
    assert seen[-1] == len(data)
    assert fs.cat_file(f"{root}/big.bin") == data
    fs.get_file(f"{root}/big.bin", str(tmp_path / "out" / "big.bin"))
    assert (tmp_path / "out" / "big.bin").read_bytes() == data


def test_copy_shares_chunks_and_moves_no_bytes(tmp_path: Path) -> None:
    fs = GrabenFileSystem(url=str(tmp_path / "store"), chunk_size=64 * 1024)
    try:
        data = os.urandom(10 * 64 * 1024)
        fs.pipe_file("/a", data)
        chunks_before = sorted((tmp_path / "store" / "chunks").rglob("*"))
        fs.cp_file("/a", "/copy/a")
        assert sorted((tmp_path / "store" / "chunks").rglob("*")) == chunks_before
        assert fs.cat_file("/copy/a") == data
        fs.pipe_file("/a", b"new")  # the copy is a file of its own
        assert fs.cat_file("/copy/a") == data
        fs.rm("/a")
        assert fs.cat_file("/copy/a") == data
    finally:
        fs.client.close()


def test_mv_renames_a_directory_atomically(base: str) -> None:
    fs, root = _fs(base)
    fs.pipe({f"{root}/run/{i}": str(i).encode() for i in range(20)})
    fs.mv(f"{root}/run", f"{root}/published")
    assert not fs.exists(f"{root}/run")
    assert sorted(fs.ls(f"{root}/published", detail=False)) == sorted(
        f"{root}/published/{i}" for i in range(20)
    )
    fs.mkdir(f"{root}/into")
    fs.mv(f"{root}/published/3", f"{root}/into")  # onto a directory: goes inside
    assert fs.cat_file(f"{root}/into/3") == b"3"


def test_transaction_publishes_all_files_at_once_or_none(base: str) -> None:
    fs, root = _fs(base)
    with fs.transaction:
        for i in range(3):
            with fs.open(f"{root}/t/{i}", "wb") as f:
                f.write(b"part %d" % i)
        assert not fs.exists(f"{root}/t/0")  # nothing visible before the end
    assert [fs.cat_file(f"{root}/t/{i}") for i in range(3)] == [b"part 0", b"part 1", b"part 2"]

    with pytest.raises(RuntimeError), fs.transaction:
        with fs.open(f"{root}/u/0", "wb") as f:
            f.write(b"never")
        raise RuntimeError("training step failed")
    assert not fs.exists(f"{root}/u")

    # one file that cannot be committed keeps every other one out
    with pytest.raises(FileExistsError), fs.transaction:
        with fs.open(f"{root}/v/new", "wb") as f:
            f.write(b"new")
        with fs.open(f"{root}/v/taken", "xb") as f:
            f.write(b"mine")
        taken = urllib.parse.urlsplit(fs.unstrip_protocol(f"{root}/v/taken")).path
        fs.client.put(taken, b"theirs")  # another writer wins the name
    assert not fs.exists(f"{root}/v/new")
    assert fs.cat_file(f"{root}/v/taken") == b"theirs"
    assert not fs._intrans  # the filesystem leaves transaction mode either way


def test_every_write_in_a_transaction_is_all_or_nothing(base: str, tmp_path: Path) -> None:
    """pipe_file, put_file, touch and cp_file join it as open does (the docs' example
    pipes)."""
    fs, root = _fs(base)
    fs.pipe_file(f"{root}/src", b"source")
    local = tmp_path / "local.bin"
    local.write_bytes(b"local")

    def write_all(into: str) -> None:
        fs.pipe_file(f"{into}/piped", b"piped")
        fs.put_file(str(local), f"{into}/put")
        fs.touch(f"{into}/touched")
        fs.cp_file(f"{root}/src", f"{into}/copied")
        fs.pipe({f"{into}/many/{i}": b"%d" % i for i in range(3)})

    with pytest.raises(RuntimeError), fs.transaction:
        write_all(f"{root}/failed")
        assert not fs.exists(f"{root}/failed/piped")  # nothing visible before the end
        raise RuntimeError("training step failed")
    assert not fs.exists(f"{root}/failed")

    with fs.transaction:
        write_all(f"{root}/done")
        assert not fs.exists(f"{root}/done")
    assert fs.cat_file(f"{root}/done/piped") == b"piped"
    assert fs.cat_file(f"{root}/done/put") == b"local"
    assert fs.cat_file(f"{root}/done/touched") == b""
    assert fs.cat_file(f"{root}/done/copied") == b"source"
    assert [fs.cat_file(f"{root}/done/many/{i}") for i in range(3)] == [b"0", b"1", b"2"]


@pytest.mark.parametrize("compression", ["gzip", "bz2", "xz"])
def test_open_with_compression(base: str, compression: str) -> None:
    text = "".join(f"line {i}\n" for i in range(10_000))
    url = f"{base}/log.txt"
    with fsspec.open(url, "wt", compression=compression) as f:
        f.write(text)
    with fsspec.open(url, "rt", compression=compression) as f:
        assert f.read() == text
    fs, path = _fs(url)
    assert fs.size(path) < len(text)  # stored compressed


def test_pandas_parquet_round_trip(base: str) -> None:
    frame = pd.DataFrame({"step": range(5000), "loss": [1.0 / (i + 1) for i in range(5000)]})
    frame.to_parquet(f"{base}/metrics.parquet")
    back = pd.read_parquet(f"{base}/metrics.parquet", columns=["loss"])
    pd.testing.assert_series_equal(back["loss"], frame["loss"])
    frame.to_csv(f"{base}/metrics.csv.gz", index=False)
    pd.testing.assert_frame_equal(pd.read_csv(f"{base}/metrics.csv.gz"), frame)


def test_pyarrow_dataset_partitioned(base: str) -> None:
    fs, root = _fs(base)
    table = pa.table({"shard": [i % 4 for i in range(1000)], "value": list(range(1000))})
    pq.write_to_dataset(table, f"{root}/ds", filesystem=fs, partition_cols=["shard"])
    assert len(fs.ls(f"{root}/ds")) == 4
    dataset = ds.dataset(f"{root}/ds", filesystem=fs, format="parquet", partitioning="hive")
    back = dataset.to_table(filter=ds.field("shard") == 2)
    assert sorted(back["value"].to_pylist()) == list(range(2, 1000, 4))
    assert dataset.count_rows() == 1000


@pytest.mark.slow
def test_dcp_fsspec_writer_and_reader_with_two_gloo_ranks(cluster_url: str) -> None:
    """dcp.save/load(checkpoint_id="graben://...") with 2 real gloo ranks: DCP picks its
    stock FsspecWriter/FsspecReader for the URL and the state round-trips."""
    name = f"/ckpt-{uuid.uuid4().hex[:8]}/step-1"
    url = f"{cluster_url}{name}"
    assert_ok(run_ranks(DCP_RANKS, "save", url, 2))
    with connect(cluster_url) as client:
        names = {e.path.rsplit("/", 1)[1] for e in client.ls(name)}
    assert ".metadata" in names
    assert {"__0_0.distcp", "__1_0.distcp"} <= names
    assert_ok(run_ranks(DCP_RANKS, "load", url, 2))


def test_client_copy_is_exposed(client: Client) -> None:
    client.put("/src", b"abc" * 1000)
    info = client.copy("/src", "/dst/copy")
    assert info.size == 3000
    assert client.get("/dst/copy") == b"abc" * 1000
    with pytest.raises(FileExistsError):
        client.copy("/src", "/dst/copy", exclusive=True)
