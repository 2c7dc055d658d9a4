"""CachedMapDataset: samples by index over the same shards and node cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pytest
import torch.utils.data
from torch.utils.data import DataLoader, DistributedSampler

from graben.dataloader import (
    CachedDataset,
    CachedMapDataset,
    index_files,
    read_manifest,
    write_dataset,
)
from graben.store import InvalidArgument

N = 203


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = str(tmp_path_factory.mktemp("ds") / "rows")
    table = pa.table({"id": list(range(N)), "text": [f"row {i}" for i in range(N)]})
    write_dataset(url, table, rows_per_shard=20, rows_per_group=7)
    return url


def _listed(batch: list[Any]) -> list[Any]:
    return batch


def test_every_kind_by_index(tmp_path: Path, rows: str) -> None:
    ds = CachedMapDataset(rows, cache_dir=tmp_path / "cache")
    assert len(ds) == N
    assert [ds[i]["id"] for i in range(N)] == list(range(N))  # type: ignore[index]
    assert ds[-1] == {"id": N - 1, "text": f"row {N - 1}"}
    for wrong in (N, -N - 1):
        with pytest.raises(IndexError, match=f"out of range for {N} samples"):
            ds[wrong]

    blobs = [bytes([i % 256]) * i for i in range(50)]
    write_dataset(str(tmp_path / "blobs"), blobs, rows_per_shard=8)
    records = CachedMapDataset(str(tmp_path / "blobs"), cache_dir=tmp_path / "cache")
    assert [records[i] for i in reversed(range(50))] == blobs[::-1]

    for i in range(3):
        (tmp_path / "files" / f"d{i}").mkdir(parents=True)
        (tmp_path / "files" / f"d{i}" / "x.bin").write_bytes(b"file %d" % i)
    index_files(str(tmp_path / "files"))
    files = CachedMapDataset(str(tmp_path / "files"), cache_dir=tmp_path / "cache")
    assert [files[i] for i in range(3)] == [b"file 0", b"file 1", b"file 2"]
    assert [files.key(i) for i in range(3)] == ["d0/x.bin", "d1/x.bin", "d2/x.bin"]


def test_readers_kept_are_bounded(tmp_path: Path, rows: str) -> None:
    ds = CachedMapDataset(rows, cache_dir=tmp_path / "cache", open_shards=2)
    for i in (0, 40, 80, 120, 160, 200, 1, 41):  # a different shard each time
        assert ds[i]["id"] == i  # type: ignore[index]
        assert len(ds._readers) <= 2
    with pytest.raises(ValueError, match="open_shards"):
        CachedMapDataset(rows, cache_dir=tmp_path / "cache", open_shards=0)


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_a_shuffled_dataloader_with_workers_reads_each_sample_once(
    tmp_path: Path, rows: str, start: str
) -> None:
    ds = CachedMapDataset(rows, cache_dir=tmp_path / "cache")
    ds[5]  # the parent used it first: the workers map their own shards
    loader = DataLoader(
        ds, batch_size=8, shuffle=True, num_workers=2, multiprocessing_context=start
    )
    ids = [i for batch in loader for i in batch["id"].tolist()]
    assert sorted(ids) == list(range(N)) and ids != list(range(N))


def test_distributed_sampler_splits_it_between_ranks(tmp_path: Path, rows: str) -> None:
    ds = CachedMapDataset(rows, cache_dir=tmp_path / "cache")
    seen: list[int] = []
    for rank in range(3):
        sampler = DistributedSampler(ds, num_replicas=3, rank=rank, seed=1, drop_last=True)
        loader = DataLoader(ds, batch_size=5, sampler=sampler, collate_fn=_listed)
        seen += [s["id"] for batch in loader for s in batch]
    assert len(seen) == len(set(seen)) == N - N % 3


def test_keys_and_folder_labels_survive_dataset_write(tmp_path: Path) -> None:
    from graben.store.cli._main import main

    files = {"cat/a.jpg": b"meow" * 10, "cat/b/c.jpg": b"purr", "dog/d.jpg": b"woof" * 3}
    for name, data in files.items():
        (tmp_path / "src" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / name).write_bytes(data)
    (tmp_path / "src" / ".hidden").write_bytes(b"left out")
    url = str(tmp_path / "ds")
    assert main(["dataset", "write", str(tmp_path / "src"), url]) == 0
    ds = CachedMapDataset(url, cache_dir=tmp_path / "cache")
    assert ds.classes == ("cat", "dog")
    got = {ds.key(i): ds[i] for i in range(len(ds))}
    assert set(got) == set(files)
    for name, sample in got.items():
        assert isinstance(sample, dict)
        assert sample["data"] == files[name]
        assert ds.classes[sample["label"]] == name.split("/")[0]  # ImageFolder's labels
    iterable = CachedDataset(url, cache_dir=tmp_path / "cache")
    assert sorted(s["key"] for s in iterable) == sorted(files)  # type: ignore[index]


def test_a_manifest_from_before_labels_still_reads(tmp_path: Path, rows: str) -> None:
    old = msgspec.json.decode((Path(rows) / "manifest.json").read_bytes())
    del old["classes"]  # as written before the field existed
    (tmp_path / "old").mkdir()
    for shard in Path(rows).glob("shard-*"):
        (tmp_path / "old" / shard.name).write_bytes(shard.read_bytes())
    (tmp_path / "old" / "manifest.json").write_bytes(msgspec.json.encode(old))
    assert read_manifest(str(tmp_path / "old")).classes == ()
    ds = CachedMapDataset(str(tmp_path / "old"), cache_dir=tmp_path / "cache")
    assert ds.classes == () and ds[7]["id"] == 7  # type: ignore[index]
    with pytest.raises(InvalidArgument, match="no keys"):
        ds.key(0)


def test_reading_by_index_from_a_cluster_and_from_s3(
    where: tuple[str, Any], tmp_path: Path
) -> None:
    url, options = where
    write_dataset(url, [{"id": i} for i in range(57)], rows_per_shard=10, storage_options=options)
    ds = CachedMapDataset(url, cache_dir=tmp_path / "cache", storage_options=options)
    assert [ds[i]["id"] for i in range(56, -1, -1)] == list(range(56, -1, -1))  # type: ignore[index]
    assert isinstance(ds, torch.utils.data.Dataset)
