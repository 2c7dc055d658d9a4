"""Chunks the metadata engine keeps itself (small files), on both engines: committed with
their bytes, served in the layout, checked, collected, never "degraded"."""

from __future__ import annotations

import pytest
from pg_kit import MIGRATIONS, Engine, chunk, file

from graben.store import IntegrityError, InvalidArgument
from graben.store._hashing import chunk_ref
from graben.store._types import Extent, FileCommit, StoredChunk
from graben.store.meta import Metadata


def small(path: str, data: bytes) -> FileCommit:
    """A commit of a one-chunk file whose bytes the engine is to keep."""
    ref = chunk_ref(data)
    return FileCommit(path, (Extent(0, len(data), ref),), (StoredChunk(ref, (), data),))


def test_a_small_file_is_kept_in_the_engine_and_served_with_its_layout(engine: Engine) -> None:
    ns = Metadata(engine.open())
    ns.commits.commit((small("/a/f", b"hello"),))
    layout = ns.namespace.layout("/a/f")
    (extent,) = layout.extents
    assert layout.replicas == {} and layout.inline == {extent.chunk.id: b"hello"}
    assert ns.namespace.stat("/a/f").size == 5 and ns.quotas.usage("/") == (1, 5)
    page = ns.records.chunk_refs()
    assert page.chunks == [(extent.chunk, ())] and page.inline == {extent.chunk.id: b"hello"}
    assert ns.records.degraded() == [] and ns.records.check_metadata() == []


def test_two_files_of_the_same_bytes_share_one_kept_chunk(engine: Engine) -> None:
    ns = Metadata(engine.open())
    ns.commits.commit((small("/a", b"same"), small("/b", b"same")))
    assert engine.sql("SELECT COUNT(*) FROM chunk_bytes") == [(1,)]
    ns.namespace.remove("/a")
    assert ns.namespace.layout("/b").inline  # still referenced by /b
    ns.namespace.remove("/b")
    assert [(c, n) for c, n, _ in ns.records.collectable(0.0)] == [(chunk_ref(b"same").id, ())]
    assert engine.sql("SELECT COUNT(*) FROM chunk_bytes") == [(0,)]


@pytest.mark.parametrize(
    ("stored", "error"),
    [
        (StoredChunk(chunk_ref(b"real"), (), b"fake"), IntegrityError),  # crc32c differs
        (StoredChunk(chunk_ref(b"x" * 10), (), b"y" * 10), IntegrityError),
        (StoredChunk(chunk_ref(b"real"), ("n1",), b"real"), InvalidArgument),
    ],
)
def test_bytes_that_are_not_the_chunk_they_name_are_refused(
    engine: Engine, stored: StoredChunk, error: type[Exception]
) -> None:
    ns = Metadata(engine.open())
    ref = stored.chunk
    with pytest.raises(error):
        ns.commits.commit((FileCommit("/f", (Extent(0, ref.length, ref),), (stored,)),))
    assert engine.sql("SELECT COUNT(*) FROM chunk_bytes") == [(0,)]


def test_a_forged_id_with_a_matching_crc_is_refused(engine: Engine) -> None:
    """Bytes whose crc32c and length match but whose blake3 is another chunk's: kept, they
    would be served to every file naming that chunk."""
    ns = Metadata(engine.open())
    ref = chunk_ref(b"genuine")
    forged = type(ref)("0" * 64, ref.length, ref.crc32c)
    commit = FileCommit("/f", (Extent(0, 7, forged),), (StoredChunk(forged, (), b"genuine"),))
    with pytest.raises(IntegrityError, match="hash"):
        ns.commits.commit((commit,))


def test_a_service_keeps_no_more_than_its_limit(engine: Engine) -> None:
    ns = Metadata(engine.open(), inline_max=100)
    assert ns.commits.settings().inline_max == 100
    with pytest.raises(InvalidArgument, match="inline limit of 100"):
        ns.commits.commit((small("/f", b"z" * 101),))
    off = Metadata(engine.open(), inline_max=0)
    with pytest.raises(InvalidArgument):
        off.commits.commit((small("/f", b"z"),))
    ns.commits.commit((small("/g", b"z" * 100),))
    assert off.namespace.layout("/g").inline  # kept bytes stay readable whatever the limit is now
    with pytest.raises(InvalidArgument):
        Metadata(engine.open(), inline_max=-1)


def test_fsck_of_the_engine_finds_kept_bytes_of_the_wrong_length(engine: Engine) -> None:
    ns = Metadata(engine.open())
    ns.commits.commit((small("/f", b"hello"),))
    engine.sql("UPDATE chunk_bytes SET data = %s", b"hell")
    (problem,) = ns.records.check_metadata()
    assert problem.kind == "metadata" and "keeps 4 bytes" in problem.detail


def test_a_store_of_schema_6_gains_kept_chunks(engine: Engine) -> None:
    ns = Metadata(engine.open())
    ns.commits.commit((file("/old", [chunk(1)]),))
    engine.back_to_7()
    engine.sql("DROP TABLE chunk_bytes")
    engine.set_version(6)
    migrated = Metadata(engine.open(create=False))
    assert engine.version() == MIGRATIONS
    migrated.commits.commit((small("/new", b"after"),))
    assert migrated.namespace.layout("/new").inline == {chunk_ref(b"after").id: b"after"}
    assert migrated.namespace.layout("/old").replicas == {chunk(1).id: ("n1",)}
