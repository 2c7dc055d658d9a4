"""Storage classes and erasure-coded chunks in the metadata, on both engines: classes set
and found, the leader's work found by class and age, stripes swapped in for replicas in
one transaction, and everything after (layouts, dedup, repair, collection) knowing them."""

from __future__ import annotations

import time

import pytest
from pg_kit import Engine, chunk, file

from graben.store import InvalidArgument, NotFound
from graben.store._hashing import chunk_ref
from graben.store._types import ChunkRef, ClassState, Extent, FileCommit, StoredChunk, Stripe
from graben.store.meta import Metadata

NODES = tuple(f"n{i}" for i in range(1, 7))


def stripe_of(c: ChunkRef, k: int = 2, m: int = 1, nodes: tuple[str, ...] = NODES) -> Stripe:
    """A stripe record for ``c`` (pieces named after it; no bytes behind them)."""
    pieces = tuple(chunk(c.crc32c * 100 + i, c.length // k) for i in range(k + m))
    return Stripe(k, m, pieces, nodes[: k + m])


def test_a_class_set_on_a_directory_rules_the_files_below_it(engine: Engine) -> None:
    ns = Metadata(engine.open())
    ns.commits.commit(
        (file("/d/sub/f", [chunk(1)]), file("/d/keep/g", [chunk(2)]), file("/h", [chunk(3)]))
    )
    assert ns.classes.set_class("/d", " ec:6+3@60m ") == "ec:6+3@1h"
    assert ns.classes.set_class("/d/keep", "replicated") == "replicated"
    assert ns.classes.class_of("/d/sub/f") == ClassState("ec:6+3@1h", "/d", 1, 0)
    assert ns.classes.class_of("/d/keep/g").name == "replicated"
    assert ns.classes.class_of("/d") == ClassState("ec:6+3@1h", "/d")
    assert ns.classes.class_of("/h") == ClassState("", "", 1, 0)
    tiny = chunk_ref(b"hello")  # a small file's bytes, kept by the engine: no class to take
    ns.commits.commit(
        (FileCommit("/d/tiny", (Extent(0, 5, tiny),), (StoredChunk(tiny, (), b"hello"),)),)
    )
    assert ns.classes.class_of("/d/tiny") == ClassState("ec:6+3@1h", "/d", 0, 0)
    ns.classes.set_class("/", "ec:2+1")
    assert ns.classes.class_of("/h") == ClassState("ec:2+1", "/", 1, 0)
    ns.classes.set_class("/d", "")
    assert ns.classes.class_of("/d/sub/f").name == "ec:2+1"
    with pytest.raises(InvalidArgument, match="unknown storage class"):
        ns.classes.set_class("/d", "fast")
    with pytest.raises(NotFound):
        ns.classes.set_class("/nope", "ec:2+1")


def test_the_leader_finds_replicated_chunks_of_files_old_enough_for_their_class(
    engine: Engine,
) -> None:
    ns = Metadata(engine.open())
    ns.commits.commit((file("/now/a", [chunk(1), chunk(2)]), file("/later/b", [chunk(3)])))
    ns.commits.commit((file("/plain/c", [chunk(4)]), file("/now/except/d", [chunk(5)])))
    ns.classes.set_class("/now", "ec:2+1")
    ns.classes.set_class("/later", "ec:2+1@1h")
    ns.classes.set_class("/now/except", "replicated")
    work = ns.classes.to_convert(100)
    assert sorted(w.chunk.id for w in work) == sorted([chunk(1).id, chunk(2).id])
    assert {w.target.name for w in work} == {"ec:2+1"} and work[0].replicas == ("n1",)
    an_hour_on = time.time_ns() + 3601 * 10**9
    assert len(ns.classes.to_convert(100, now_ns=an_hour_on)) == 3
    assert len(ns.classes.to_convert(1)) == 1


def test_a_stripe_replaces_the_copies_in_one_write_and_readers_see_it(engine: Engine) -> None:
    ns = Metadata(engine.open())
    c = chunk(7, 3000)
    ns.commits.commit((file("/d/f", [c], nodes=("n1", "n2")),))
    ns.classes.set_class("/d", "ec:2+1")
    stripe = stripe_of(c)
    assert ns.classes.record_stripe(c.id, stripe, "replaced by its ec:2+1 stripe") == ("n1", "n2")
    layout = ns.namespace.layout("/d/f")
    assert layout.replicas == {} and layout.stripes == {c.id: stripe} and layout.inline == {}
    assert ns.classes.class_of("/d/f") == ClassState("ec:2+1", "/d", 1, 1)
    # The old copies await deletion by the next round; the chunk is not short of copies.
    assert sorted(ns.records.bad_copies()) == [
        (c.id, n, "replaced by its ec:2+1 stripe") for n in ("n1", "n2")
    ]
    assert ns.records.degraded() == [] and ns.classes.to_convert(10) == []
    # A second conversion of the same chunk (a leader that died before hearing) is a no-op.
    assert ns.classes.record_stripe(c.id, stripe, "again") == ()
    assert ns.records.chunk_refs().stripes == {c.id: stripe}
    assert ns.records.known(p.id for p in stripe.pieces) == {p.id for p in stripe.pieces}


def test_a_new_file_of_the_same_bytes_reuses_the_stripe(engine: Engine) -> None:
    ns = Metadata(engine.open())
    c = chunk(8, 3000)
    ns.commits.commit((file("/d/f", [c]),))
    ns.classes.record_stripe(c.id, stripe_of(c), "striped")
    (placement,) = ns.commits.prepare((c,), 3)
    assert not placement.upload and placement.nodes == ()
    ns.commits.commit((file("/e/g", [c], nodes=()),))
    assert ns.namespace.layout("/e/g").stripes == ns.namespace.layout("/d/f").stripes


def test_pieces_on_dead_nodes_are_short_and_repair_moves_them(engine: Engine) -> None:
    ns = Metadata(engine.open())
    c = chunk(9, 3000)
    ns.commits.commit((file("/d/f", [c]),))
    stripe = stripe_of(c)
    ns.classes.record_stripe(c.id, stripe, "striped")
    assert ns.classes.short_stripes(["n1", "n2", "n3"]) == []
    assert ns.classes.short_stripes(["n1", "n3"]) == [(c, stripe)]
    ns.classes.record_pieces([(c.id, 1, "n2", "n5")])
    assert ns.namespace.layout("/d/f").stripes[c.id].nodes == ("n1", "n5", "n3")
    # A piece reported damaged is on no node until repair makes it again.
    ns.records.report_bad(stripe.pieces[2].id, "n3", "crc32c mismatch")
    assert ns.namespace.layout("/d/f").stripes[c.id].nodes == ("n1", "n5", "")
    assert ns.classes.short_stripes(["n1", "n5", "n3"]) == [
        (c, ns.namespace.layout("/d/f").stripes[c.id])
    ]
    ns.classes.record_pieces([(c.id, 2, "n3", "n4")])
    assert ns.classes.short_stripes(["n1", "n4", "n5"]) == []


def test_a_collected_chunk_frees_its_pieces_but_not_those_another_stripe_shares(
    engine: Engine,
) -> None:
    ns = Metadata(engine.open())
    a, b = chunk(10, 3000), chunk(11, 3000)
    ns.commits.commit((file("/a", [a]), file("/b", [b])))
    first = stripe_of(a)
    second = Stripe(2, 1, (first.pieces[0], *stripe_of(b).pieces[1:]), NODES[3:6])
    ns.classes.record_stripe(a.id, first, "striped")
    ns.classes.record_stripe(b.id, second, "striped")
    ns.namespace.remove("/a")
    gone = {c: nodes for c, nodes, _ in ns.records.collectable(0.0)}
    assert gone[a.id] == ()  # the chunk itself: no copies left
    assert {p.id: gone[p.id] for p in first.pieces[1:]} == {
        p.id: (n,) for p, n in zip(first.pieces[1:], first.nodes[1:], strict=True)
    }
    assert first.pieces[0].id not in gone  # /b's stripe still uses it
    assert ns.namespace.layout("/b").stripes == {b.id: second}
