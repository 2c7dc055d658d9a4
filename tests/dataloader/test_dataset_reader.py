"""CachedDataset: every sample once per epoch, one global order, resume, the node cache."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import torch
from dataset_kit import N

from graben.dataloader import (
    CachedDataset,
    CachedLoader,
    NodeCache,
    index_files,
    read_manifest,
    write_dataset,
)
from graben.dataloader._cache import PIECE


def _ids(samples: list[Any]) -> list[int]:
    return [int(s["id"]) for s in samples]


def _blobs(ds: CachedDataset) -> list[bytes]:
    return [s for s in ds if isinstance(s, bytes)]


def _listed(batch: list[Any]) -> list[Any]:
    return batch


def _epoch(url: str, cache: Path, world: int, workers: int, **kw: Any) -> list[list[int]]:
    """Each simulated rank's samples, in the order its DataLoader yields them."""
    out = []
    for rank in range(world):
        ds = CachedDataset(url, cache_dir=cache, rank=rank, world_size=world, seed=5, **kw)
        loader = CachedLoader(ds, batch_size=4, num_workers=workers, collate_fn=_listed)
        out.append([i for batch in loader for i in _ids(batch)])
    return out


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_every_sample_once_per_epoch_in_one_order(
    dataset: str, tmp_path: Path, world: int, workers: int
) -> None:
    ranks = _epoch(dataset, tmp_path / "cache", world, workers)
    assert len({len(r) for r in ranks}) == 1  # equal per rank: no DDP hang
    merged = [ranks[j % world][j // world] for j in range(len(ranks[0]) * world)]
    assert set(merged) == set(range(N)) and len(merged) - N < world  # padding only wraps
    single = _epoch(dataset, tmp_path / "cache", 1, 0)[0]
    assert merged[:N] == single  # the same global order for every split


def test_drop_last_cuts_instead_of_padding(dataset: str, tmp_path: Path) -> None:
    ranks = _epoch(dataset, tmp_path / "cache", 4, 0, drop_last=True)
    assert [len(r) for r in ranks] == [N // 4] * 4
    assert len({i for r in ranks for i in r}) == N // 4 * 4


def test_epochs_differ_and_shuffle_off_reads_in_order(dataset: str, tmp_path: Path) -> None:
    ds = CachedDataset(dataset, cache_dir=tmp_path, seed=1)
    first = _ids(list(ds))
    ds.set_epoch(1)
    assert sorted(_ids(list(ds))) == sorted(first) and _ids(list(ds)) != first
    plain = CachedDataset(f"file://{dataset}", cache_dir=tmp_path, shuffle=False)
    assert _ids(list(plain)) == list(range(N))  # a file:// URL reads as the path does


@pytest.mark.parametrize(("before", "after"), [(2, 2), (4, 2), (2, 3), (1, 4)])
def test_resume_mid_epoch_on_any_world_size(
    dataset: str, tmp_path: Path, before: int, after: int
) -> None:
    full = _ids(list(CachedDataset(dataset, cache_dir=tmp_path, seed=9)))
    seen: list[int] = []
    states = []
    for rank in range(before):  # each rank reads 10 samples, then the job stops
        ds = CachedDataset(dataset, cache_dir=tmp_path, seed=9, rank=rank, world_size=before)
        it = iter(ds)
        seen.append([_ids([next(it)])[0] for _ in range(10)])  # type: ignore[arg-type]
        states.append(ds.state_dict())
    assert len({s["position"] for s in states}) == 1
    done = [seen[j % before][j // before] for j in range(10 * before)]  # type: ignore[index]
    rest_by_rank = []
    for rank in range(after):
        ds = CachedDataset(dataset, cache_dir=tmp_path, seed=9, rank=rank, world_size=after)
        ds.load_state_dict(states[0])
        rest_by_rank.append(_ids(list(ds)))
    assert len({len(r) for r in rest_by_rank}) == 1
    rest = [rest_by_rank[j % after][j // after] for j in range(len(rest_by_rank[0]) * after)]
    assert done + rest[: N - len(done)] == full  # nothing repeated, nothing skipped


def test_a_loader_with_workers_resumes_where_the_loop_was(dataset: str, tmp_path: Path) -> None:
    full = _ids(list(CachedDataset(dataset, cache_dir=tmp_path, seed=4)))
    taken, states = [], []
    for rank in range(2):  # 2 ranks x 2 workers take 3 batches of 4, then the job stops
        ds = CachedDataset(dataset, cache_dir=tmp_path, seed=4, rank=rank, world_size=2)
        loader = CachedLoader(ds, batch_size=4, num_workers=2, collate_fn=_listed)
        batches = iter(loader)
        taken.append([i for _ in range(3) for i in _ids(next(batches))])
        states.append(loader.state_dict())  # the workers have read further than the loop
        del batches
    assert states[0] == states[1] == {"epoch": 0, "position": 24, "seed": 4}
    done = [taken[j % 2][j // 2] for j in range(24)]
    rest_by_rank = []
    for rank in range(3):  # resumed on 3 ranks, 1 worker each
        ds = CachedDataset(dataset, cache_dir=tmp_path, seed=4, rank=rank, world_size=3)
        loader = CachedLoader(ds, batch_size=5, num_workers=1, collate_fn=_listed)
        loader.load_state_dict(states[0])
        rest_by_rank.append([i for batch in loader for i in _ids(batch)])
        assert loader.state_dict()["position"] >= N
    rest = [rest_by_rank[j % 3][j // 3] for j in range(len(rest_by_rank[0]) * 3)]
    assert done + rest[: N - 24] == full


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_a_loader_sums_its_workers_stats(dataset: str, tmp_path: Path, start: str) -> None:
    ds = CachedDataset(dataset, cache_dir=tmp_path, seed=2)
    loader = CachedLoader(ds, batch_size=8, num_workers=2, multiprocessing_context=start)
    assert sum(len(batch["id"]) for batch in loader) == N
    manifest = read_manifest(dataset)
    stats = ds.stats  # the workers' fills and waits, seen from the loop's process
    assert stats["cache_fills"] == len(manifest.shards)
    assert stats["bytes_fetched"] == manifest.size and stats["seconds_waited"] > 0


def test_a_loader_refuses_what_would_break_resume(dataset: str, tmp_path: Path) -> None:
    ds = CachedDataset(dataset, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="in order"):
        CachedLoader(ds, batch_size=2, num_workers=1, in_order=False)


def _peak_memory(url: str, cache: str) -> tuple[int, int, int]:
    """Read an epoch; the peak of Python's and of pyarrow's allocations, and the samples."""
    import tracemalloc

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = pa.BufferOutputStream()  # pyarrow's lazy imports (pandas...) before the count starts
    pq.write_table(pa.table({"x": [b"x"]}), out)
    group = pq.ParquetFile(pa.BufferReader(out.getvalue())).read_row_group(0)
    group.take(np.zeros(1, np.int64)).to_pylist()
    tracemalloc.start()
    count = sum(1 for _ in CachedDataset(url, cache_dir=cache, prefetch=2))
    return tracemalloc.get_traced_memory()[1], pa.default_memory_pool().max_memory(), count


def test_a_reader_holds_one_group_not_its_shards(tmp_path: Path) -> None:
    rows = 2048  # 2 shards of 16 MiB, in row groups of 512 KiB
    table = pa.table({"id": list(range(rows)), "data": [os.urandom(16384) for _ in range(rows)]})
    url = str(tmp_path / "big")
    manifest = write_dataset(url, table, rows_per_shard=1024, rows_per_group=32, compression=None)
    assert min(s.size for s in manifest.shards) > 16 << 20
    with multiprocessing.get_context("spawn").Pool(1) as pool:  # a fresh arrow memory pool
        python_peak, arrow_peak, count = pool.apply(_peak_memory, (url, str(tmp_path / "c")))
    assert count == rows
    assert arrow_peak < 4 << 20  # a decoded row group or two, not a 16 MiB shard
    assert python_peak < 2 * PIECE + (4 << 20)  # 2 fills' pieces (prefetch=2) and a group's rows


@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_each_sample_comes_whole_however_much_of_its_group_a_rank_reads(
    tmp_path: Path, world: int
) -> None:
    """A rank reads all of a group, half of it or a few rows: each sample is its own row."""
    rows = 240
    payload = [os.urandom(64) for _ in range(rows)]
    table = pa.table({"id": list(range(rows)), "label": ["cat", "dog"] * 120, "data": payload})
    url = str(tmp_path / "ds")
    write_dataset(url, table, rows_per_shard=120, rows_per_group=24)
    seen = []
    for rank in range(world):
        ds = CachedDataset(url, cache_dir=tmp_path / "c", rank=rank, world_size=world, seed=3)
        seen += list(ds)
    assert {s["id"] for s in seen} == set(range(rows))
    for sample in seen:
        i = sample["id"]
        assert sample == {"id": i, "label": ["cat", "dog"][i % 2], "data": payload[i]}


def test_bytes_samples_are_read_by_groups_of_records(tmp_path: Path) -> None:
    samples = [os.urandom(i) for i in range(50)]
    manifest = write_dataset(str(tmp_path / "blobs"), samples, rows_per_shard=16, rows_per_group=5)
    assert manifest.shards[0].groups == (5, 5, 5, 1)
    ds = CachedDataset(str(tmp_path / "blobs"), cache_dir=tmp_path / "c", shuffle=False)
    assert list(ds) == samples
    shuffled = _blobs(CachedDataset(str(tmp_path / "blobs"), cache_dir=tmp_path / "c", seed=2))
    assert sorted(shuffled) == sorted(samples) and shuffled != samples


def test_files_in_place_one_sample_a_file(where: tuple[str, Any], tmp_path: Path) -> None:
    import fsspec

    url, options = where
    fs, root = fsspec.core.url_to_fs(url, **(options or {}))
    fs.makedirs(f"{root}/img", exist_ok=True)
    files = {f"img/{i:03d}.jpg": os.urandom(100 + i) for i in range(12)}
    files["img/empty.jpg"] = b""
    for name, data in files.items():
        fs.pipe_file(f"{root}/{name}", data)
    manifest = index_files(url, storage_options=options)
    assert (manifest.kind, manifest.samples) == ("files", 13)
    assert read_manifest(url, options) == manifest
    ds = CachedDataset(url, cache_dir=tmp_path / "c", storage_options=options, seed=1)
    assert sorted(_blobs(ds)) == sorted(files.values())
    assert ds.stats["bytes_fetched"] == sum(map(len, files.values()))


def test_the_cache_fetches_once_and_refetches_a_damaged_shard(dataset: str, tmp_path: Path) -> None:
    ds = CachedDataset(dataset, cache_dir=tmp_path, shuffle=False)
    list(ds)
    manifest = read_manifest(dataset)
    shards = len(manifest.shards)
    assert ds.stats["cache_fills"] == shards and ds.stats["bytes_fetched"] == manifest.size
    again = CachedDataset(dataset, cache_dir=tmp_path, shuffle=False)
    assert _ids(list(again)) == list(range(N))
    assert again.stats["cache_fills"] == 0 and again.stats["cache_hits"] >= shards
    victim = next(p for p in tmp_path.iterdir() if p.name.endswith("shard-00003.parquet"))
    victim.write_bytes(b"\0" * victim.stat().st_size)  # damaged on disk
    third = CachedDataset(dataset, cache_dir=tmp_path, shuffle=False)
    assert _ids(list(third)) == list(range(N))
    assert third.stats["refetched"] == 1 and third.stats["cache_fills"] == 1


def _read_all(url: str, cache: str, limit: int, seed: int) -> None:
    ds = CachedDataset(url, cache_dir=cache, cache_limit=limit, seed=seed)
    assert len(list(ds)) == N


def test_four_processes_share_a_cache_within_its_limit(dataset: str, tmp_path: Path) -> None:
    sizes = [s.size for s in read_manifest(dataset).shards]
    limit = 3 * max(sizes)
    cache = NodeCache(tmp_path, limit)
    context = multiprocessing.get_context("spawn")
    procs = [
        context.Process(target=_read_all, args=(dataset, str(tmp_path), limit, s)) for s in range(4)
    ]
    for p in procs:
        p.start()
    peak = 0
    while any(p.is_alive() for p in procs):
        peak = max(peak, cache.used())
        time.sleep(0.005)
    assert [p.exitcode for p in procs] == [0] * 4
    assert 0 < peak <= limit and cache.used() <= limit


def _fill_forever(url: str, cache: str) -> None:
    import graben.dataloader._cache as c

    def die(*args: Any) -> None:
        os.kill(os.getpid(), signal.SIGKILL)  # die holding the shard's lock, mid-fill

    c._copy = die  # type: ignore[assignment]
    list(CachedDataset(url, cache_dir=cache, shuffle=False))


def test_a_process_killed_mid_fill_does_not_block_the_next(dataset: str, tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    victim = context.Process(target=_fill_forever, args=(dataset, str(tmp_path)))
    victim.start()
    victim.join(60)
    assert victim.exitcode == -signal.SIGKILL
    ds = CachedDataset(dataset, cache_dir=tmp_path, shuffle=False)
    assert _ids(list(ds)) == list(range(N))  # no stale lock held it up


_ = torch


def test_reading_from_a_cluster_and_from_s3(where: tuple[str, Any], tmp_path: Path) -> None:
    url, options = where
    write_dataset(url, [{"id": i} for i in range(57)], rows_per_shard=10, storage_options=options)
    ds = CachedDataset(url, cache_dir=tmp_path / "cache", storage_options=options, seed=3)
    assert sorted(_ids(list(ds))) == list(range(57))
    assert ds.stats["bytes_fetched"] == read_manifest(url, options).size


def test_the_dataset_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from graben.store.cli._main import main

    (tmp_path / "files").mkdir()
    for i in range(5):
        (tmp_path / "files" / f"{i}.bin").write_bytes(b"%d" % i * (i + 1))
    url, cache = str(tmp_path / "ds"), str(tmp_path / "cache")
    assert main(["dataset", "write", str(tmp_path / "files"), url, "--rows-per-shard", "2"]) == 0
    assert main(["dataset", "inspect", url]) == 0
    assert "parquet, 5 samples, 3 shards" in capsys.readouterr().out
    assert main(["dataset", "warm", url, "--cache-dir", cache]) == 0
    assert '"cache_fills": 3' in capsys.readouterr().out
    assert main(["dataset", "cache", "--cache-dir", cache]) == 0
    assert "3 shards" in capsys.readouterr().out
    ds = CachedDataset(url, cache_dir=cache, shuffle=False)
    files = [{"key": f"{i}.bin", "data": b"%d" % i * (i + 1)} for i in range(5)]
    assert list(ds) == files  # each file's name kept beside its bytes
    assert ds.stats["cache_fills"] == 0  # warm filled it
    assert main(["dataset", "cache", "--cache-dir", cache, "--clear"]) == 0
    assert main(["dataset", "index", str(tmp_path / "files")]) == 0
    assert "5 files (15 bytes) indexed" in capsys.readouterr().out
    plain = CachedDataset(str(tmp_path / "files"), cache_dir=cache, shuffle=False)
    assert list(plain) == [b"%d" % i * (i + 1) for i in range(5)]
    assert main(["dataset", "inspect", str(tmp_path / "missing")]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "no dataset here" in error and "[Errno" not in error


def test_warm_shows_a_bar_on_a_terminal_only(dataset: str, tmp_path: Path) -> None:
    import pty
    import subprocess
    import sys

    command = [sys.executable, "-m", "graben.store.cli", "dataset", "warm", dataset]
    piped = subprocess.run(
        [*command, "--cache-dir", str(tmp_path / "a")], capture_output=True, text=True, check=True
    )
    assert piped.stderr == "" and '"cache_fills": 11' in piped.stdout  # a log stays clean
    leader, follower = pty.openpty()
    try:
        run = subprocess.run(
            [*command, "--cache-dir", str(tmp_path / "b"), "--cache-limit", "1G"],
            stdout=subprocess.PIPE,
            stderr=follower,
            text=True,
            check=True,
            env={**os.environ, "COLUMNS": "100", "TERM": "xterm"},
        )
        os.close(follower)
        follower = -1
        shown = b""
        while chunk := _read_some(leader):
            shown += chunk
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    assert b"warming 11 shards" in shown
    assert '"cache_fills": 11' in run.stdout


def _read_some(fd: int) -> bytes:
    try:
        return os.read(fd, 65536)
    except OSError:  # EIO: the terminal's other end is closed and drained
        return b""
