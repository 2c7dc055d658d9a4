"""The epoch's order: every sample once, the same global order for any split, resumable."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from graben.dataloader._order import Plan, consumed

GROUPS = st.lists(st.lists(st.integers(0, 15), min_size=1, max_size=4), min_size=1, max_size=8)
"""Samples in each group of each shard."""


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


@given(GROUPS, st.integers(0, 99), WORLDS, WORKERS, st.integers(1, 5))
@settings(max_examples=200, deadline=None)
def test_every_sample_once_in_one_global_order(
    groups: list[list[int]], seed: int, world: int, workers: int, batch: int
) -> None:
    plan = Plan(groups, seed=seed, epoch=3)
    total = plan.total
    ranks = _read(plan, world, workers, batch)
    assert len({len(r) for r in ranks}) == 1  # every rank reads as many
    interleaved = [ranks[j % world][j // world] for j in range(len(ranks[0]) * world)]
    assert interleaved == [p % max(1, total) for p in range(len(interleaved))]  # the one order
    assert set(interleaved) == set(range(total))  # every sample; extra ones only wrap round
    assert len(interleaved) - total < world


def test_the_order_depends_on_seed_and_epoch_only() -> None:
    groups = [[2, 3], [7], [1, 1, 1]]
    a = Plan(groups, seed=1, epoch=0).global_order()
    assert np.array_equal(a, Plan(groups, seed=1, epoch=0).global_order())
    assert not np.array_equal(a, Plan(groups, seed=1, epoch=1).global_order())
    everything = [(0, 0, 0), (0, 1, 0), (0, 2, 1), (0, 3, 1), (0, 4, 1)]
    everything += [(1, r, 0) for r in range(7)] + [(2, r, r) for r in range(3)]
    assert sorted(map(tuple, a.tolist())) == everything
    plain = Plan([[1, 1], [2]], seed=1, epoch=0, shuffle=False).global_order()
    assert plain.tolist() == [[0, 0, 0], [0, 1, 1], [1, 0, 0], [1, 1, 0]]


@given(GROUPS, st.integers(0, 99))
@settings(max_examples=100, deadline=None)
def test_a_group_is_read_whole_before_the_next(groups: list[list[int]], seed: int) -> None:
    order = Plan(groups, seed=seed, epoch=0).global_order()
    units = [(s, g) for s, _, g in order.tolist()]
    runs = [u for i, u in enumerate(units) if i == 0 or units[i - 1] != u]
    assert len(runs) == len(set(runs))  # each group in one stretch: one decode per reader
    shards = [s for i, (s, _) in enumerate(runs) if i == 0 or runs[i - 1][0] != s]
    assert len(shards) == len(set(shards))  # each shard in one stretch: one fetch


@given(GROUPS, st.sampled_from([1, 2, 3, 4]), st.sampled_from([1, 2, 3, 4]), st.data())
@settings(max_examples=200, deadline=None)
def test_resuming_on_another_world_size_neither_repeats_nor_skips(
    groups: list[list[int]], before: int, after: int, data: st.DataObject
) -> None:
    plan = Plan(groups, seed=7, epoch=0)
    total = plan.total
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
