"""torchdata's StatefulDataLoader over a CachedDataset: stopped anywhere, resumed exactly once.

Each rank of a job is simulated in turn (its rank and world size given); the
loop stops after a random number of batches, the loader's state is kept, and
a new dataset and loader (as after a restart) carry on. Every sample the rank
would have read in one uninterrupted epoch is read exactly once.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from dataset_kit import N
from torchdata.stateful_dataloader import StatefulDataLoader

from graben.dataloader import CachedDataset, CachedLoader
from graben.store import InvalidArgument

BATCH = 4


def _listed(batch: list[Any]) -> list[Any]:
    return batch


def _ids(batch: list[Any]) -> list[int]:
    return [int(s["id"]) for s in batch]


def _dataset(url: str, cache: Path, rank: int, world: int, **kw: Any) -> CachedDataset:
    return CachedDataset(url, cache_dir=cache, seed=3, rank=rank, world_size=world, **kw)


def _loader(ds: CachedDataset, workers: int, persistent: bool, **kw: Any) -> StatefulDataLoader:
    options: dict[str, Any] = {"num_workers": workers, "collate_fn": _listed, **kw}
    if workers:
        options.update(persistent_workers=persistent, prefetch_factor=3)
    return StatefulDataLoader(ds, batch_size=BATCH, **options)


def _whole_epoch(url: str, cache: Path, rank: int, world: int) -> Counter[int]:
    return Counter(_ids(list(_dataset(url, cache, rank, world))))


def _stop_and_resume(
    url: str, cache: Path, rank: int, world: int, workers: int, persistent: bool, stop: int
) -> tuple[list[int], list[int]]:
    """The samples a rank reads before it stops after ``stop`` batches, and after it resumes."""
    loader = _loader(_dataset(url, cache, rank, world), workers, persistent)
    batches = iter(loader)
    before = [i for _ in range(stop) for i in _ids(next(batches))]
    state = loader.state_dict()
    del batches, loader
    resumed = _loader(_dataset(url, cache, rank, world), workers, persistent)
    resumed.load_state_dict(state)
    after = [i for batch in resumed for i in _ids(batch)]
    return before, after


LAYOUTS = [(0, False), (1, False), (1, True), (2, False), (2, True)]


@pytest.mark.parametrize(("workers", "persistent"), LAYOUTS)
def test_stopped_at_a_random_batch_and_resumed_reads_each_sample_once(
    dataset: str, tmp_path: Path, workers: int, persistent: bool
) -> None:
    rng = random.Random(f"{workers}{persistent}")
    world = 2
    for rank in range(world):
        whole = _whole_epoch(dataset, tmp_path, rank, world)
        stop = rng.randrange(1, sum(whole.values()) // BATCH)
        before, after = _stop_and_resume(dataset, tmp_path, rank, world, workers, persistent, stop)
        assert len(before) == stop * BATCH
        assert Counter(before + after) == whole, f"rank {rank}, stopped after {stop} batches"


@pytest.mark.slow
@pytest.mark.parametrize(("workers", "persistent"), LAYOUTS)
@pytest.mark.parametrize("world", [1, 3])
def test_every_stop_of_an_epoch_resumes_exactly(
    dataset: str, tmp_path: Path, workers: int, persistent: bool, world: int
) -> None:
    whole = _whole_epoch(dataset, tmp_path, 0, world)
    for stop in range(1, sum(whole.values()) // BATCH, 7):
        before, after = _stop_and_resume(dataset, tmp_path, 0, world, workers, persistent, stop)
        assert Counter(before + after) == whole, f"stopped after {stop} batches"


def _job_stops(url: str, cache: Path, world: int, workers: int, stop: int) -> tuple[list[int], Any]:
    """A job of ``world`` ranks stops after ``stop`` batches: what it read in global order, rank
    0's loader state."""
    taken, states = [], []
    for rank in range(world):
        ds = _dataset(url, cache, rank, world, worker_batch=BATCH)
        loader = _loader(ds, workers, persistent=False)
        batches = iter(loader)
        taken.append([i for _ in range(stop) for i in _ids(next(batches))])
        states.append(loader.state_dict())
        del batches
    done = [taken[j % world][j // world] for j in range(stop * BATCH * world)]
    return done, states[0]


@pytest.mark.parametrize(("workers", "then"), [(2, 1), (0, 2), (1, 0)])
def test_resumed_on_another_world_size_and_number_of_workers(
    dataset: str, tmp_path: Path, workers: int, then: int
) -> None:
    full = _ids(list(CachedDataset(dataset, cache_dir=tmp_path, seed=3)))
    done, state = _job_stops(dataset, tmp_path, world=2, workers=workers, stop=5)
    rest_by_rank = []
    for rank in range(3):  # 3 ranks now: the old loader's state goes to each new dataset
        ds = _dataset(dataset, tmp_path, rank, 3, worker_batch=BATCH)
        ds.load_state_dict(state)
        loader = _loader(ds, then, persistent=False)
        rest_by_rank.append([i for batch in loader for i in _ids(batch)])
    rest = [rest_by_rank[j % 3][j // 3] for j in range(len(rest_by_rank[0]) * 3)]
    assert done + rest[: N - len(done)] == full  # nothing repeated, nothing skipped


def test_a_worker_state_on_another_layout_is_refused(dataset: str, tmp_path: Path) -> None:
    _, state = _job_stops(dataset, tmp_path, world=2, workers=2, stop=3)
    # one worker: torch takes 5 s per worker to stop workers that failed to start
    loader = _loader(_dataset(dataset, tmp_path, 0, 3, worker_batch=BATCH), 1, persistent=False)
    loader.load_state_dict(state)
    with pytest.raises(ValueError, match="world size 2, 2 workers") as raised:
        iter(loader)
    assert "CachedDataset.load_state_dict" in str(raised.value)  # it says what to do instead


def test_out_of_order_workers_cannot_be_turned_into_a_position(
    dataset: str, tmp_path: Path
) -> None:
    loader = _loader(_dataset(dataset, tmp_path, 0, 1), 2, persistent=False)  # worker_batch=1
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    state = loader.state_dict()
    del batches
    with pytest.raises(ValueError, match="worker_batch"):
        _dataset(dataset, tmp_path, 0, 2).load_state_dict(state)


def test_the_main_process_state_with_workers_raises(dataset: str, tmp_path: Path) -> None:
    ds = _dataset(dataset, tmp_path, 0, 1)
    assert ds.state_dict() == {"epoch": 0, "position": 0, "seed": 3}
    loader = StatefulDataLoader(ds, batch_size=BATCH, num_workers=2, collate_fn=_listed)
    batches = iter(loader)
    next(batches)
    with pytest.raises(InvalidArgument, match="workers read this dataset"):
        ds.state_dict()  # the main process's copy never read a sample
    assert ds.state_dict(samples_seen=8)["position"] == 8
    del batches
    ds.set_epoch(1)  # a new epoch from its start: the state is known again
    assert ds.state_dict() == {"epoch": 1, "position": 0, "seed": 3}


@pytest.mark.parametrize("make", ["stateful", "cached"])
def test_persistent_workers_follow_set_epoch(dataset: str, tmp_path: Path, make: str) -> None:
    ds = _dataset(dataset, tmp_path, 0, 1)
    loader: Any
    if make == "stateful":
        loader = StatefulDataLoader(
            ds, batch_size=BATCH, num_workers=2, persistent_workers=True, collate_fn=_listed
        )
    else:
        loader = CachedLoader(
            ds, batch_size=BATCH, num_workers=2, persistent_workers=True, collate_fn=_listed
        )
    epochs = []
    for epoch in range(3):
        ds.set_epoch(epoch)
        epochs.append([i for batch in loader for i in _ids(batch)])
    for epoch, read in enumerate(epochs):
        expected = _dataset(dataset, tmp_path, 0, 1)
        expected.set_epoch(epoch)
        assert sorted(read) == list(range(N)), f"epoch {epoch}"
        assert Counter(read) == Counter(_ids(list(expected)))
    assert epochs[0] != epochs[1] != epochs[2]  # each epoch's own order reached the workers
    assert len(loader._iterator._workers) == 2  # the same two workers throughout


def test_a_resumed_epoch_then_the_next_with_persistent_workers(
    dataset: str, tmp_path: Path
) -> None:
    before, after = [], []
    loader = _loader(_dataset(dataset, tmp_path, 0, 1), 2, persistent=True)
    batches = iter(loader)
    before = [i for _ in range(7) for i in _ids(next(batches))]
    state = loader.state_dict()
    del batches, loader
    ds = _dataset(dataset, tmp_path, 0, 1)
    resumed = _loader(ds, 2, persistent=True)
    resumed.load_state_dict(state)
    after = [i for batch in resumed for i in _ids(batch)]
    assert sorted(before + after) == list(range(N))
    ds.set_epoch(1)  # the same workers, now the whole of the next epoch
    assert sorted(i for batch in resumed for i in _ids(batch)) == list(range(N))


def test_a_cached_loader_with_persistent_workers_resumes(dataset: str, tmp_path: Path) -> None:
    ds = _dataset(dataset, tmp_path, 0, 1)
    loader = CachedLoader(ds, batch_size=BATCH, num_workers=2, persistent_workers=True)
    ds.set_epoch(0)
    sum(len(b["id"]) for b in loader)  # one whole epoch; the workers stay
    ds.set_epoch(1)
    batches = iter(loader)
    before = [i for _ in range(6) for i in next(batches)["id"].tolist()]
    state = loader.state_dict()
    del batches
    assert state == {"epoch": 1, "position": 6 * BATCH, "seed": 3}
    loader.load_state_dict(state)  # the same persistent workers carry on from there
    after = [i for b in loader for i in b["id"].tolist()]
    assert sorted(before + after) == list(range(N))
