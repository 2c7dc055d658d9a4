"""Chunk placement: eligibility, rack spread, weighting, stability and its errors."""

from __future__ import annotations

import errno
import random
from collections import Counter
from collections.abc import Collection, Sequence

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from graben.store._config import RESERVE
from graben.store._errors import CannotPlace, InvalidArgument, NoSpace
from graben.store._types import NodeState
from graben.store.meta._placement import place

GiB = 1 << 30
CHUNK = 4 << 20
ROOM = CHUNK + RESERVE
"""The least free space that takes a CHUNK."""
KEYS = [f"chunk-{i:05d}" for i in range(20_000)]


def node(id: str, rack: str = "r0", free: int = 100 * GiB, alive: bool = True) -> NodeState:
    return NodeState(id, f"{id}.cluster:7070", rack, free, 1024 * GiB, alive=alive)


def grid(racks: int, per_rack: int, free: int = 100 * GiB) -> list[NodeState]:
    return [node(f"r{r}n{i}", f"r{r}", free) for r in range(racks) for i in range(per_rack)]


def eligible(nodes: Sequence[NodeState], exclude: Collection[str] = ()) -> list[NodeState]:
    """The spec's eligibility, written independently of the module's."""
    return [n for n in nodes if n.alive and n.id not in exclude and n.free >= ROOM]


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[NodeState], frozenset[str]]:
    """Up to 12 nodes on up to 5 racks, some dead, full or excluded."""
    count = draw(st.integers(0, 12))
    racks = draw(st.integers(1, 5))
    free = st.one_of(st.sampled_from([0, ROOM - 1, ROOM]), st.integers(ROOM, 1 << 44))
    nodes = [
        node(
            f"n{i}",
            f"r{draw(st.integers(0, racks - 1))}",
            draw(free),
            draw(st.sampled_from([True, True, True, False])),
        )
        for i in range(count)
    ]
    exclude = draw(st.frozensets(st.sampled_from([n.id for n in nodes]))) if nodes else frozenset()
    return nodes, exclude


@st.composite
def placeable(draw: st.DrawFn) -> tuple[list[NodeState], frozenset[str], int]:
    """A cluster and a replication it has enough eligible nodes for."""
    nodes, exclude = draw(clusters())
    ready = len(eligible(nodes, exclude))
    if ready == 0:
        nodes = [*nodes, node("spare")]
        ready = 1
    return nodes, exclude, draw(st.integers(1, min(ready, 5)))


keys = st.text(max_size=20)


# Where replicas go


@given(placeable(), keys)
def test_replicas_go_to_distinct_eligible_nodes(
    case: tuple[list[NodeState], frozenset[str], int], key: str
) -> None:
    nodes, exclude, replication = case
    chosen = place(nodes, replication, key, CHUNK, exclude)
    assert len(chosen) == replication
    assert len(set(chosen)) == replication
    assert set(chosen) <= {n.id for n in eligible(nodes, exclude)}


@given(placeable(), keys)
def test_distinct_racks_whenever_there_are_enough(
    case: tuple[list[NodeState], frozenset[str], int], key: str
) -> None:
    nodes, exclude, replication = case
    racks = {n.rack for n in eligible(nodes, exclude)}
    chosen = place(nodes, replication, key, CHUNK, exclude)
    rack_of = {n.id: n.rack for n in nodes}
    if len(racks) >= replication:
        assert len({rack_of[i] for i in chosen}) == replication


@given(placeable(), keys)
def test_spread_is_even_over_racks(
    case: tuple[list[NodeState], frozenset[str], int], key: str
) -> None:
    nodes, exclude, replication = case
    capacity = Counter(n.rack for n in eligible(nodes, exclude))
    rack_of = {n.id: n.rack for n in nodes}
    used = Counter(rack_of[i] for i in place(nodes, replication, key, CHUNK, exclude))
    # A rack may hold two more replicas than another only if the other has no node left.
    for heavy in capacity:
        for light in capacity:
            if used[heavy] >= used[light] + 2:
                assert used[light] == capacity[light], (used, capacity)


def test_fewer_racks_than_replicas_fill_every_rack_first() -> None:
    nodes = [*grid(1, 5), node("lonely", "r9")]
    for key in KEYS[:500]:
        chosen = place(nodes, 3, key, CHUNK)
        assert "lonely" in chosen
        assert len(set(chosen)) == 3


def test_one_rack_still_takes_distinct_nodes() -> None:
    chosen = place(grid(1, 4), 4, "k", CHUNK)
    assert sorted(chosen) == ["r0n0", "r0n1", "r0n2", "r0n3"]


def test_dead_excluded_and_full_nodes_are_never_chosen() -> None:
    nodes = [
        *grid(3, 2),
        node("dead", "r0", alive=False),
        node("excluded", "r1"),
        node("full", "r2", free=ROOM - 1),
    ]
    for key in KEYS[:2000]:
        chosen = place(nodes, 3, key, CHUNK, exclude={"excluded"})
        assert not {"dead", "excluded", "full"} & set(chosen)


def test_reserve_is_kept_beyond_the_chunk() -> None:
    assert RESERVE >= 1 << 20
    assert place([node("a", free=ROOM)], 1, "k", CHUNK) == ("a",)
    with pytest.raises(NoSpace):
        place([node("a", free=ROOM - 1)], 1, "k", CHUNK)


# Determinism and stability


@given(placeable(), keys, st.randoms(use_true_random=False))
def test_same_inputs_same_placement_in_any_order(
    case: tuple[list[NodeState], frozenset[str], int], key: str, rnd: random.Random
) -> None:
    nodes, exclude, replication = case
    shuffled = list(nodes)
    rnd.shuffle(shuffled)
    first = place(nodes, replication, key, CHUNK, exclude)
    assert place(nodes, replication, key, CHUNK, exclude) == first
    assert place(shuffled, replication, key, CHUNK, list(exclude)) == first


def test_placement_depends_on_the_key() -> None:
    placements = {place(grid(4, 4), 3, key, CHUNK) for key in KEYS[:200]}
    assert len(placements) > 50


@given(placeable(), keys, st.data())
def test_removing_a_node_moves_only_its_replica(
    case: tuple[list[NodeState], frozenset[str], int], key: str, data: st.DataObject
) -> None:
    nodes, exclude, replication = case
    gone = data.draw(st.sampled_from(nodes))
    rest = [n for n in nodes if n is not gone]
    if len(eligible(rest, exclude)) < replication:
        return
    before = place(nodes, replication, key, CHUNK, exclude)
    after = place(rest, replication, key, CHUNK, exclude)
    if gone.id in before:
        assert set(before) - {gone.id} <= set(after)
    else:
        assert after == before


@given(placeable(), keys, st.sampled_from(["r0", "r1", "r9"]), st.integers(ROOM, 1 << 44))
def test_adding_a_node_moves_only_what_it_takes(
    case: tuple[list[NodeState], frozenset[str], int], key: str, rack: str, free: int
) -> None:
    nodes, exclude, replication = case
    before = place(nodes, replication, key, CHUNK, exclude)
    after = place([*nodes, node("new", rack, free)], replication, key, CHUNK, exclude)
    if "new" in after:
        assert len(set(before) - set(after)) == 1
    else:
        assert after == before


@given(placeable(), keys, st.data(), st.integers(1, 1 << 40))
def test_more_free_space_never_drops_a_node(
    case: tuple[list[NodeState], frozenset[str], int], key: str, data: st.DataObject, extra: int
) -> None:
    nodes, exclude, replication = case
    grown = data.draw(st.sampled_from(nodes))
    bigger = node(grown.id, grown.rack, grown.free + extra, grown.alive)
    after_nodes = [bigger if n is grown else n for n in nodes]
    before = place(nodes, replication, key, CHUNK, exclude)
    after = place(after_nodes, replication, key, CHUNK, exclude)
    if grown.id in before:
        assert grown.id in after
    elif grown.id not in after:
        assert after == before


@given(placeable(), keys, st.data())
def test_excluding_a_node_is_removing_it(
    case: tuple[list[NodeState], frozenset[str], int], key: str, data: st.DataObject
) -> None:
    nodes, exclude, replication = case
    failed = data.draw(st.sampled_from(nodes)).id
    rest = [n for n in nodes if n.id != failed]
    if len(eligible(rest, exclude)) < replication:
        return
    assert place(nodes, replication, key, CHUNK, {*exclude, failed}) == place(
        rest, replication, key, CHUNK, exclude
    )


def test_a_new_node_takes_about_its_share_and_nothing_else_moves() -> None:
    nodes, keys = grid(4, 4), KEYS[:5000]
    before = [place(nodes, 3, k, CHUNK) for k in keys]
    after = [place([*nodes, node("new", "r4")], 3, k, CHUNK) for k in keys]
    moved = [(b, a) for b, a in zip(before, after, strict=True) if b != a]
    assert all("new" in a and len(set(b) - set(a)) == 1 for b, a in moved)
    # 17 equal nodes, 3 replicas each: the newcomer's fair share is 3/17 ~ 0.18 of chunks.
    assert 0.12 < len(moved) / len(keys) < 0.24


def test_a_lost_node_moves_only_its_chunks() -> None:
    nodes, keys = grid(4, 4), KEYS[:5000]
    rest = [n for n in nodes if n.id != "r2n1"]
    for key in keys:
        before, after = place(nodes, 3, key, CHUNK), place(rest, 3, key, CHUNK)
        if "r2n1" in before:
            assert len(set(before) - set(after)) == 1
        else:
            assert after == before


# Weighting by free space


def test_twice_the_free_space_takes_twice_the_chunks() -> None:
    nodes = [node("big", "r0", 200 * GiB), node("small", "r1", 100 * GiB)]
    counts = Counter(place(nodes, 1, key, CHUNK)[0] for key in KEYS)
    assert 1.8 <= counts["big"] / counts["small"] <= 2.2


def test_weighting_holds_among_many_nodes_and_racks() -> None:
    frees = {"a": 1, "b": 1, "c": 2, "d": 2, "e": 4, "f": 4}
    nodes = [node(i, f"r{n % 3}", f * 50 * GiB) for n, (i, f) in enumerate(frees.items())]
    # The first replica is the overall winner, so it follows the weights exactly.
    counts = Counter(place(nodes, 3, key, CHUNK)[0] for key in KEYS)
    for lighter, heavier in [("a", "c"), ("b", "d"), ("c", "e"), ("d", "f")]:
        assert 1.8 <= counts[heavier] / counts[lighter] <= 2.2, counts


def test_equal_nodes_share_evenly() -> None:
    counts = Counter(i for key in KEYS[:6000] for i in place(grid(3, 2), 3, key, CHUNK))
    assert all(abs(c - 3000) < 300 for c in counts.values()), counts


# Errors


@pytest.mark.parametrize("replication", [0, -1])
def test_replication_below_one_is_invalid(replication: int) -> None:
    with pytest.raises(InvalidArgument, match="replication"):
        place(grid(3, 1), replication, "k", CHUNK)


def test_negative_length_is_invalid() -> None:
    with pytest.raises(InvalidArgument, match="length"):
        place(grid(3, 1), 1, "k", -1)


def test_repeated_node_ids_are_invalid() -> None:
    with pytest.raises(InvalidArgument, match="r0n0"):
        place([*grid(3, 1), node("r0n0", "r5")], 1, "k", CHUNK)


def test_too_few_live_nodes_is_unavailable_and_says_why() -> None:
    nodes = [
        node("ok"),
        node("d1", alive=False),
        node("d2", alive=False),
        node("x"),
        node("full", free=ROOM - 1),
    ]
    with pytest.raises(CannotPlace) as caught:
        place(nodes, 3, "k", CHUNK, exclude={"x"})
    message = str(caught.value)
    assert "need 3 nodes" in message
    assert "1 of 5 eligible" in message
    assert "2 dead" in message
    assert "1 excluded" in message
    assert "1 full" in message
    assert str(ROOM) in message


def test_merely_full_nodes_is_no_space() -> None:
    nodes = [node("ok"), *(node(f"f{i}", free=RESERVE) for i in range(3))]
    with pytest.raises(NoSpace) as caught:
        place(nodes, 3, "k", CHUNK)
    assert caught.value.errno == errno.ENOSPC
    assert "need 3 nodes, 1 of 4 eligible; 3 full" in str(caught.value)


def test_space_is_the_error_only_when_space_would_be_enough() -> None:
    nodes = [node("ok"), node("dead", alive=False), node("f1", free=0), node("f2", free=0)]
    with pytest.raises(NoSpace, match="1 dead, 2 full"):
        place(nodes, 3, "k", CHUNK)
    with pytest.raises(CannotPlace, match="need 4 nodes, 1 of 4 eligible"):
        place(nodes, 4, "k", CHUNK)


def test_an_empty_cluster_is_unavailable() -> None:
    with pytest.raises(CannotPlace, match="need 1 node, 0 of 0 eligible"):
        place([], 1, "k", CHUNK)


@given(clusters(), st.integers(1, 5))
def test_errors_exactly_when_too_few_nodes_are_eligible(
    cluster: tuple[list[NodeState], frozenset[str]], replication: int
) -> None:
    nodes, exclude = cluster
    ready = eligible(nodes, exclude)
    if len(ready) >= replication:
        assert len(place(nodes, replication, "k", CHUNK, exclude)) == replication
        return
    up = [n for n in nodes if n.alive and n.id not in exclude]
    expected = NoSpace if len(up) >= replication else CannotPlace
    with pytest.raises(expected, match=f"need {replication} nodes?, {len(ready)} of"):
        place(nodes, replication, "k", CHUNK, exclude)


# Draining nodes (``graben node drain``)


def test_a_draining_node_takes_no_new_chunk() -> None:
    nodes = [*grid(3, 2)[:5], msgspec.structs.replace(grid(3, 2)[5], state="draining")]
    chosen = Counter(i for key in KEYS[:2000] for i in place(nodes, 3, key, CHUNK))
    assert "r2n1" not in chosen and len(chosen) == 5


def test_placement_that_needs_a_draining_node_says_it_is_draining() -> None:
    nodes = [node("a"), node("b"), msgspec.structs.replace(node("c"), state="draining")]
    with pytest.raises(CannotPlace, match="1 draining; draining: c"):
        place(nodes, 3, "k", CHUNK)
