"""Collection in the metadata, on both engines: the leader's page forgotten under the
lease, each chunk with the moment it lost its last reference as its copies' cutoff, the
record of it that a late commit reads, and what ``status`` shows of it."""

from __future__ import annotations

import time

import pytest
from pg_kit import Engine, chunk, file

from graben.store import IntegrityError
from graben.store._types import ChunkRef, FileCommit, Receipt, StoredChunk
from graben.store.meta import Metadata
from graben.store.meta._leader import Deposed
from graben.store.wire._auth import RECEIPT_TTL_S


def _written_at(commit: FileCommit, when: float) -> FileCommit:
    """``commit`` with each copy's receipt saying it was written at ``when``."""
    stored = tuple(
        StoredChunk(
            s.chunk,
            s.nodes,
            receipts=tuple(Receipt(s.chunk.id, n, when + RECEIPT_TTL_S, "") for n in s.nodes),
        )
        for s in commit.stored
    )
    return FileCommit(commit.path, commit.extents, stored)


def _removed(ns: Metadata, path: str, c: ChunkRef) -> float:
    """Commit ``path`` of chunk ``c`` and remove it; when it lost its last reference."""
    ns.commits.commit((file(path, [c], nodes=("n1", "n2")),))
    before = time.time()
    ns.namespace.remove(path)
    return before


def test_a_round_forgets_chunks_past_their_grace_each_under_its_own_cutoff(
    engine: Engine,
) -> None:
    ns = Metadata(engine.open())
    old, young, used = chunk(1), chunk(2), chunk(3)
    ns.commits.commit((file("/used", [used]),))
    lost = _removed(ns, "/old", old)
    time.sleep(0.3)
    _removed(ns, "/young", young)
    [(ref, nodes, cutoff)] = ns.records.collect(0.2, 100)
    assert (ref, nodes) == (old, ("n1", "n2"))
    assert lost <= cutoff / 1e9 <= lost + 0.2  # when /old went, not when the round ran
    with ns.repo.read() as tx:
        assert tx.chunks.collected([old.id, young.id, used.id]) == {old.id: cutoff}
    assert {c.id for c, _, _ in ns.records.collect(0.0, 100)} == {young.id}
    assert ns.records.collect(0.0, 100) == []


def test_status_counts_what_waits_and_what_was_freed(engine: Engine) -> None:
    ns = Metadata(engine.open())
    _removed(ns, "/a", chunk(1, 1000))
    _removed(ns, "/b", chunk(2, 500))
    ns.commits.commit((file("/kept", [chunk(3)]),))
    waiting = ns.nodes.health().collection
    assert (waiting.waiting, waiting.waiting_bytes, waiting.freed) == (2, 2 * 1500, 0)
    assert waiting.grace_s is None  # nothing here collects by itself
    ns.records.collect(0.0, 1)
    after = ns.nodes.health().collection
    assert (after.waiting, after.waiting_bytes, after.freed, after.freed_bytes) == (
        1,
        2 * 500,
        1,
        2 * 1000,
    )


def test_a_deposed_leader_forgets_nothing(engine: Engine) -> None:
    ns = Metadata(engine.open())
    _removed(ns, "/a", chunk(1))
    with pytest.raises(Deposed):
        ns.records.collect(0.0, 100, fence=12345)
    assert ns.nodes.health().collection.waiting == 1


def test_a_copy_written_again_after_the_cutoff_is_committed(engine: Engine) -> None:
    """The race the leader's cutoff is for: the bytes uploaded again after their file went,
    the old copies collected meanwhile (the node kept the rewritten file), then the
    commit."""
    ns = Metadata(engine.open())
    c = chunk(1)
    _removed(ns, "/old", c)
    again = _written_at(file("/new", [c], nodes=("n1", "n2")), time.time())
    ns.records.collect(0.0, 100)
    ns.commits.commit((again,))
    assert ns.namespace.layout("/new").replicas == {c.id: ("n1", "n2")}


def test_a_copy_written_before_the_cutoff_and_committed_after_is_refused(
    engine: Engine,
) -> None:
    """A writer that stored the bytes before another file's removal made them unused, and
    commits only once the leader collected them: its copies may be gone, so the commit
    fails (the file is not there) rather than name bytes that are not."""
    ns = Metadata(engine.open())
    c = chunk(1)
    early = _written_at(file("/late", [c], nodes=("n1", "n2")), time.time())
    time.sleep(0.01)
    _removed(ns, "/other", c)
    ns.records.collect(0.0, 100)
    with pytest.raises(IntegrityError, match="collected while this file was being written"):
        ns.commits.commit((early,))
    unsigned = file("/unproven", [c], nodes=("n3",))
    bare = FileCommit(unsigned.path, unsigned.extents, (StoredChunk(c, ("n3",)),))
    with pytest.raises(IntegrityError):  # no receipt: nothing shows when it was written
        ns.commits.commit((bare,))
    assert ns.nodes.health().collection.waiting == 0


def test_a_late_commit_keeps_the_copies_shown_fresh_and_drops_the_rest(engine: Engine) -> None:
    ns = Metadata(engine.open())
    c = chunk(1)
    early = _written_at(file("/late", [c], nodes=("n1",)), time.time())
    time.sleep(0.01)
    _removed(ns, "/other", c)
    ns.records.collect(0.0, 100)
    fresh = _written_at(file("/late", [c], nodes=("n2",)), time.time())
    both = FileCommit(
        early.path,
        early.extents,
        (
            StoredChunk(
                c, ("n1", "n2"), receipts=(*early.stored[0].receipts, *fresh.stored[0].receipts)
            ),
        ),
    )
    ns.commits.commit((both,))
    assert ns.namespace.layout("/late").replicas == {c.id: ("n2",)}
