"""Datasets on S3 (moto's real server): shards fetched by obstore where it can stand
in for s3fs, by s3fs otherwise, the same samples either way."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import fsspec
import pytest
from dataset_kit import N, write_rows

from graben.dataloader import CachedDataset, CachedLoader
from graben.dataloader._s3 import native_fetch
from graben.store import IntegrityError, NotFound


def _listed(batch: list[Any]) -> list[Any]:
    return batch


def _ids(ds: CachedDataset, workers: int = 0) -> list[int]:
    loader = CachedLoader(ds, batch_size=8, num_workers=workers, collate_fn=_listed)
    return [int(s["id"]) for batch in loader for s in batch]


@pytest.fixture
def s3_rows(s3_options: dict[str, Any], tmp_path: Path) -> str:
    return write_rows(f"s3://data/{tmp_path.name}")


@pytest.fixture(autouse=True)
def _moto_rows_written_with_options(monkeypatch: pytest.MonkeyPatch, s3_options: Any) -> None:
    # write_rows takes no options: s3fs finds moto through the AWS environment
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_options["client_kwargs"]["endpoint_url"])
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_options["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_options["secret"])
    monkeypatch.setenv("AWS_REGION", s3_options["client_kwargs"]["region_name"])
    monkeypatch.delenv("AWS_PROFILE", raising=False)


def _read_with_s3fs_refused(url: str, options: dict[str, Any], cache: str) -> list[list[int]]:
    """Every sample, by 2 forked workers and then by this process, with s3fs made to
    refuse shard reads once the manifest is read (forked workers inherit the refusal):
    only obstore can have fetched them. Workers first: they are forked from a process
    whose obstore has not fetched yet."""
    import s3fs

    def refuse(*_args: Any, **_kwargs: Any) -> bytes:
        raise AssertionError("a shard was fetched through s3fs")

    datasets = [
        CachedDataset(url, cache_dir=f"{cache}{workers}", storage_options=options, seed=1)
        for workers in (2, 0)
    ]  # their manifests read through s3fs
    s3fs.S3FileSystem.cat_file = refuse
    read = []
    for workers, ds in zip((2, 0), datasets, strict=True):
        read.append(_ids(ds, workers))
        assert ds.stats["cache_fills"] == 11  # every shard, by this process or its workers
    return read


def test_shards_come_through_obstore_with_s3fs_options(
    s3_rows: str, s3_options: dict[str, Any], tmp_path: Path
) -> None:
    # a fresh process: s3fs is patched there only, and its obstore has not fetched yet
    by_workers, by_the_loop = _in_fresh_process(
        _read_with_s3fs_refused, s3_rows, s3_options, str(tmp_path / "c")
    )
    assert sorted(by_workers) == sorted(by_the_loop) == list(range(N))


def _in_fresh_process(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` in a spawned process (not a daemon: it may start DataLoader workers)."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=_put_result, args=(results, fn, *args))
    child.start()
    try:
        ok, value = results.get(timeout=120)
    finally:
        child.join(30)
    if not ok:
        raise AssertionError(value)
    return value


def _put_result(results: Any, fn: Any, *args: Any) -> None:
    try:
        results.put((True, fn(*args)))
    except BaseException as exc:
        results.put((False, repr(exc)))


@pytest.mark.timeout(120)
def test_workers_forked_after_the_loop_used_obstore_fetch_through_s3fs(
    s3_rows: str, s3_options: dict[str, Any], tmp_path: Path
) -> None:
    ds = CachedDataset(s3_rows, cache_dir=tmp_path / "a", storage_options=s3_options)
    assert sorted(_ids(ds)) == list(range(N))  # obstore's threads now run in this process
    ds = CachedDataset(s3_rows, cache_dir=tmp_path / "b", storage_options=s3_options)
    assert sorted(_ids(ds, workers=2)) == list(range(N))  # they would hang in a fork


def test_the_aws_environment_is_enough_and_what_obstore_cannot_do_stays_with_s3fs(
    s3_rows: str, s3_options: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert native_fetch(s3_rows, {}) is not None  # keys, endpoint, region from the environment
    ds = CachedDataset(s3_rows, cache_dir=tmp_path / "env", shuffle=False)
    assert _ids(ds) == list(range(N))

    tuned = {**s3_options, "config_kwargs": {"max_pool_connections": 4}}  # s3fs's alone
    assert native_fetch(s3_rows, tuned) is None
    ds = CachedDataset(s3_rows, cache_dir=tmp_path / "s3fs", storage_options=tuned, shuffle=False)
    assert _ids(ds) == list(range(N))

    monkeypatch.setenv("AWS_PROFILE", "team")  # credentials s3fs's chain would look up
    assert native_fetch(s3_rows, {}) is None
    monkeypatch.delenv("AWS_REGION")  # s3fs asks the bucket where it lives
    monkeypatch.delenv("AWS_PROFILE")
    assert native_fetch(s3_rows, {}) is None
    assert native_fetch("/local/path", {}) is None


@pytest.mark.parametrize("damage", ["cut short", "gone"])
def test_a_damaged_shard_on_s3_is_told_not_served(
    s3_rows: str, s3_options: dict[str, Any], tmp_path: Path, damage: str
) -> None:
    fs = fsspec.filesystem("s3", **s3_options)
    shard = f"{s3_rows.removeprefix('s3://')}/shard-00003.parquet"
    if damage == "gone":
        fs.rm(shard)
    else:
        fs.pipe_file(shard, fs.cat_file(shard)[:-100])
    ds = CachedDataset(s3_rows, cache_dir=tmp_path / "c", storage_options=s3_options)
    expected = NotFound if damage == "gone" else IntegrityError
    with pytest.raises(expected) as failed:
        _ids(ds)
    assert "shard-00003.parquet" in str(failed.value)
