"""A backup's hold on collection, and the restore point, on both engines."""

from __future__ import annotations

import time

from pg_kit import Engine

from graben.store._hashing import chunk_ref
from graben.store._types import Extent, FileCommit, StoredChunk
from graben.store.meta import Metadata

HOUR_NS = 3600 * 10**9


def small(path: str, data: bytes) -> FileCommit:
    """A one-chunk file the engine keeps (no data node needed)."""
    ref = chunk_ref(data)
    return FileCommit(path, (Extent(0, len(data), ref),), (StoredChunk(ref, (), data),))


def test_a_backup_holds_collection_off_what_is_unreferenced_after_it(engine: Engine) -> None:
    ns = Metadata(engine.open())
    ns.commits.commit((small("/before", b"gone before"), small("/after", b"gone after")))
    ns.namespace.remove("/before")
    time.sleep(0.01)
    now = time.time_ns()
    ns.repo.transact(lambda tx: tx.identity.hold("b1", now, now + HOUR_NS))
    ns.namespace.remove("/after")
    assert _collected(ns.records.collectable(0.0)) == [(chunk_ref(b"gone before").id, ())]
    assert ns.records.collectable(0.0) == []  # held: the backup's /after needs it
    engine.sql("UPDATE backups SET until_ns = %s", now)  # the hold ran out
    assert _collected(ns.records.collectable(0.0)) == [(chunk_ref(b"gone after").id, ())]


def _collected(page: list[tuple[str, tuple[str, ...], float]]) -> list[tuple[str, tuple[str, ...]]]:
    """Each chunk of a page of ``collectable`` with its nodes (its cutoff left out)."""
    return [(chunk, held) for chunk, held, _ in page]


def test_a_restored_store_drops_its_backups_hold_and_remembers_it(engine: Engine) -> None:
    ns = Metadata(engine.open())
    assert ns.repo.transact(lambda tx: tx.identity.mark_restored()) == 0
    ns.repo.transact(lambda tx: tx.identity.hold("old", 5, 2**62))
    ns.repo.transact(lambda tx: tx.identity.hold("newest", 7, 2**62))
    assert ns.repo.transact(lambda tx: tx.identity.mark_restored()) == 7
    assert engine.sql("SELECT name FROM backups") == [("old",)]
    with ns.repo.read() as tx:
        assert tx.identity.restored_ns() == 7
