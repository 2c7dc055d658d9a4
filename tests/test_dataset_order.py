"""The epoch's order: every sample once, the same global order for any split, resumable."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from graben.dataloader._order import Plan, consumed

COUNTS = st.lists(st.integers(0, 40), min_size=1, max_size=8)


def _read(plan: Plan, world: int, workers: int, batch: int, start: int = 0) -> list[list[int]]:
    """Each rank's positions in the order its DataLoader yields them (workers taking turns)."""
    ranks = []
    for rank in range(world):
        streams = [_stream(plan, rank, world, w, workers, batch, start) for w in range(workers)]
        merged: list[int] = []
        while any(streams):  # the DataLoader's round robin, a batch from each worker in turn
            for stream in streams:
                merged += stream[:batch]
                del stream[:batch]
        ranks.append(merged)
    return ranks


WORLDS, WORKERS = st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 3])


def _stream(
    plan: Plan, rank: int, world: int, worker: int, workers: int, batch: int, start: int
) -> list[int]:
    split = plan.positions(
        rank, world, start=start, worker=worker, workers=workers, worker_batch=batch
    )
    return [int(p) for p in split]


@given(COUNTS, st.integers(0, 99), WORLDS, WORKERS, st.integers(1, 5))
@settings(max_examples=200, deadline=None)
def test_every_sample_once_in_one_global_order(
    counts: list[int], seed: int, world: int, workers: int, batch: int
) -> None:
    plan = Plan(counts, seed=seed, epoch=3)
    total = sum(counts)
    ranks = _read(plan, world, workers, batch)
    assert len({len(r) for r in ranks}) == 1  # every rank reads as many
    interleaved = [ranks[j % world][j // world] for j in range(len(ranks[0]) * world)]
    assert interleaved == [p % max(1, total) for p in range(len(interleaved))]  # the one order
    assert set(interleaved) == set(range(total))  # every sample; extra ones only wrap round
    assert len(interleaved) - total < world


def test_the_order_depends_on_seed_and_epoch_only() -> None:
    a = Plan([5, 7, 3], seed=1, epoch=0).global_order()
    assert np.array_equal(a, Plan([5, 7, 3], seed=1, epoch=0).global_order())
    assert not np.array_equal(a, Plan([5, 7, 3], seed=1, epoch=1).global_order())
    assert sorted(map(tuple, a)) == [(s, r) for s, n in enumerate([5, 7, 3]) for r in range(n)]
    plain = Plan([2, 2], seed=1, epoch=0, shuffle=False).global_order()
    assert plain.tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]


@given(COUNTS, st.sampled_from([1, 2, 3, 4]), st.sampled_from([1, 2, 3, 4]), st.data())
@settings(max_examples=200, deadline=None)
def test_resuming_on_another_world_size_neither_repeats_nor_skips(
    counts: list[int], before: int, after: int, data: st.DataObject
) -> None:
    plan = Plan(counts, seed=7, epoch=0)
    total = sum(counts)
    first = _read(plan, before, 1, 1)
    k = data.draw(st.integers(0, len(first[0])))
    seen = [p for j in range(k * before) for p in [first[j % before][j // before]]]
    start = consumed(0, k, before)
    if start >= total:
        return
    rest = _read(plan, after, 2, 2, start=start)
    assert len({len(r) for r in rest}) == 1
    more = [rest[j % after][j // after] for j in range(len(rest[0]) * after)]
    assert seen + more[: total - start] == list(range(total))
    assert all(p < start + len(more) for p in more)
