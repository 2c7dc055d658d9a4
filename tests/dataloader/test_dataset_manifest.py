"""A manifest is checked before anything is fetched: names inside the dataset, sane counts."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import crc32c
import fsspec
import msgspec
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graben.dataloader import (
    CachedDataset,
    Manifest,
    Shard,
    index_files,
    read_manifest,
    write_dataset,
)
from graben.store import IntegrityError, InvalidArgument

SECRET = b"a file beside the dataset, not in it\n"


@pytest.fixture(params=["local", "cluster"])
def base(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A directory holding a dataset (``ds``) and a file that is not in it (``outside.txt``)."""
    if request.param == "local":
        url = str(tmp_path / "base")
    else:
        url = f"{request.getfixturevalue('cluster_url')}/manifests/{tmp_path.name}"
    write_dataset(f"{url}/ds", [b"one", b"two"], rows_per_shard=1)
    fs, root = fsspec.core.url_to_fs(url)
    fs.pipe_file(f"{root}/outside.txt", SECRET)
    yield url
    fs.rm(root, recursive=True)


def _publish(url: str, manifest: Manifest | dict[str, Any]) -> None:
    fs, root = fsspec.core.url_to_fs(url)
    fs.makedirs(root, exist_ok=True)
    fs.pipe_file(f"{root}/manifest.json", msgspec.json.encode(manifest))


def _refused(url: str, cache: Path, *words: str) -> None:
    """Both readers refuse the manifest, naming what is wrong, before fetching any shard."""
    for read in (read_manifest, lambda u: CachedDataset(u, cache_dir=cache)):
        with pytest.raises(InvalidArgument) as refused:
            read(url)
        for word in words:
            assert word in str(refused.value)
    assert not cache.exists()  # nothing was fetched into it, it was not even made


def _hostname() -> bytes:
    return Path("/etc/hostname").read_bytes()


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("../outside.txt", lambda: SECRET),
        ("../../../../../../../../etc/hostname", _hostname),
        ("/etc/hostname", _hostname),
        ("shard-00000.records/../../outside.txt", lambda: SECRET),
    ],
    ids=["parent", "etc-hostname", "absolute", "through-a-shard"],
)
def test_a_shard_named_outside_its_dataset_is_refused(
    base: str, tmp_path: Path, name: str, data: Any
) -> None:
    target: bytes = data()
    shard = Shard(name, 1, len(target), crc32c.crc32c(target))
    _publish(f"{base}/ds", Manifest("files", (shard,)))
    _refused(f"{base}/ds", tmp_path / "cache", "shard 0", repr(name))


def test_a_manifest_claiming_2_40_samples_is_refused_before_any_allocation(
    base: str, tmp_path: Path
) -> None:
    real = read_manifest(f"{base}/ds").shards[0]
    records = msgspec.structs.replace(real, samples=1 << 40, groups=())
    _publish(f"{base}/ds", Manifest("records", (records,)))
    _refused(f"{base}/ds", tmp_path / "cache", "shard 0", "samples", str(1 << 40))
    rows = Shard("rows.parquet", 1 << 40, 1 << 20, 0, (1 << 40,))
    _publish(f"{base}/ds", Manifest("parquet", (rows,), ("id",)))
    _refused(f"{base}/ds", tmp_path / "cache", "samples", str(1 << 40))


def test_a_shard_listed_twice_is_refused(base: str, tmp_path: Path) -> None:
    """One shard three times would read its samples three times an epoch (30,000 from
    10,000): refused, naming the repeat and the shard it repeats."""
    real = read_manifest(f"{base}/ds")
    once, other = real.shards
    _publish(f"{base}/ds", msgspec.structs.replace(real, shards=(once, other, once, once)))
    _refused(f"{base}/ds", tmp_path / "cache", "shard 2", repr(once.name), "shard 0", "once")


GOOD = {"name": "a/b.records", "samples": 2, "size": 16, "crc32c": 7, "groups": [1, 1]}


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"name": ""}, ["name", "empty"]),
        ({"name": "a\0b"}, ["name", "NUL"]),
        ({"name": "..\\..\\etc\\hostname"}, ["name", "backslash"]),
        ({"name": "a//b"}, ["name", "normal"]),
        ({"name": "./a"}, ["name", "normal"]),
        ({"name": "a/"}, ["name", "normal"]),
        ({"name": "x" * 5000}, ["name", "long"]),
        ({"samples": -1}, ["samples", "-1"]),
        ({"samples": 3, "groups": [3]}, ["samples", "16 bytes"]),  # 8 bytes at least a record
        ({"size": -5}, ["size", "-5"]),
        ({"size": 1 << 50, "samples": 2}, ["size", str(1 << 50)]),
        ({"crc32c": 1 << 32}, ["crc32c"]),
        ({"crc32c": -1}, ["crc32c"]),
        ({"groups": [1, 2]}, ["groups", "(1, 2)", "2 samples"]),
        ({"groups": [3, -1]}, ["groups", "-1"]),
    ],
)
def test_a_bad_shard_entry_is_refused_naming_its_field(
    tmp_path: Path, change: dict[str, Any], words: list[str]
) -> None:
    url = str(tmp_path / "ds")
    _publish(url, {"kind": "records", "shards": [GOOD, {**GOOD, "name": "c", **change}]})
    _refused(url, tmp_path / "cache", "shard 1", *words)


@pytest.mark.parametrize(
    ("manifest", "words"),
    [
        ({"kind": "tar", "shards": [GOOD]}, ["kind", "tar"]),
        ({"kind": "files", "shards": [{**GOOD, "groups": []}]}, ["shard 0", "samples", "one"]),
        ({"kind": "records", "shards": [GOOD], "version": 2}, ["version 2"]),
        ({"kind": "records", "shards": [{**GOOD, "samples": True}]}, ["samples"]),
        (
            {
                "kind": "parquet",
                "shards": [
                    {**GOOD, "name": f"s{i}", "groups": [], "samples": 1 << 31} for i in range(3)
                ],
            },
            ["samples", str(3 << 31)],
        ),
    ],
)
def test_a_bad_manifest_is_refused(
    tmp_path: Path, manifest: dict[str, Any], words: list[str]
) -> None:
    url = str(tmp_path / "ds")
    _publish(url, manifest)
    _refused(url, tmp_path / "cache", "manifest.json", *words)


def test_a_shard_whose_row_groups_differ_from_its_manifest_is_refused(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    manifest = write_dataset(url, pa.table({"id": list(range(10))}), rows_per_shard=10)
    assert manifest.shards[0].groups == (1,) * 10
    lie = msgspec.structs.replace(manifest.shards[0], groups=(5, 5))
    _publish(url, msgspec.structs.replace(manifest, shards=(lie,)))
    with pytest.raises(IntegrityError, match="row groups"):
        list(CachedDataset(url, cache_dir=tmp_path / "cache"))


def test_index_files_refuses_a_name_no_reader_would_take(tmp_path: Path) -> None:
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "a\\b").write_bytes(b"x")
    with pytest.raises(InvalidArgument, match="backslash"):
        index_files(str(tmp_path / "ds"))
    assert not (tmp_path / "ds" / "manifest.json").exists()


ROWS = st.lists(
    st.fixed_dictionaries({"x": st.integers(-(1 << 60), 1 << 60), "s": st.text(max_size=5)}),
    min_size=1,
    max_size=60,
)
EMPTY = pa.table({"x": pa.array([], pa.int64())})
BLOBS = st.lists(st.binary(max_size=40), min_size=1, max_size=60)


@given(
    st.one_of(ROWS, BLOBS, ROWS.map(pa.Table.from_pylist), st.just(EMPTY)),
    st.integers(1, 25),
    st.one_of(st.none(), st.integers(1, 30)),
)
@settings(max_examples=60, deadline=None)
def test_every_manifest_the_writer_writes_is_accepted(
    data: Any, rows_per_shard: int, rows_per_group: int | None
) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        url = f"{scratch}/ds"
        written = write_dataset(
            url, data, rows_per_shard=rows_per_shard, rows_per_group=rows_per_group
        )
        assert read_manifest(url) == written


NAMES = st.text(
    st.characters(codec="utf-8", exclude_characters="/\\\0", exclude_categories=("Cs",)),
    min_size=1,
    max_size=12,
).filter(lambda part: part not in (".", "..") and not part.startswith("."))


@given(st.lists(st.lists(NAMES, min_size=1, max_size=3), min_size=1, max_size=8))
@settings(max_examples=60, deadline=None)
def test_every_manifest_index_files_writes_is_accepted(paths: list[list[str]]) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        made = 0
        for parts in paths:
            path = Path(scratch, *parts)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(b"sample")
                made += 1
            except OSError:
                continue  # a name clash with a directory, or too long: not a test of ours
        if made:
            written = index_files(scratch)
            assert read_manifest(scratch) == written
