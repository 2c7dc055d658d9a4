"""Idempotency keys over each engine: a mutation repeated with its key is applied once.

Every test runs on SQLite and on PostgreSQL (``engine`` in ``pg_kit.py``).
Two ``Metadata`` objects on one engine stand for two metadata services:
the repeat of a request reaches the other one, as it does after a failover.
"""

from __future__ import annotations

import time

import pytest
from pg_kit import Engine, chunk, file

from graben.store import AlreadyExists, Change, NotFound
from graben.store.meta import Metadata
from graben.store.meta._idempotency import PRUNE_EXTRA
from graben.store.transport import KEY_LIFETIME_S, new_key


@pytest.fixture
def two(engine: Engine) -> tuple[Metadata, Metadata]:
    """Two services on one engine."""
    return Metadata(engine.open()), Metadata(engine.open())


def _keys(engine: Engine) -> int:
    return int(engine.sql("SELECT COUNT(*) FROM outcomes")[0][0])


def test_a_repeated_create_exclusive_commit_returns_its_first_outcome(
    two: tuple[Metadata, Metadata], engine: Engine
) -> None:
    one, other = two
    key = new_key()
    first = one.commits.commit((file("/f", [chunk(1)], mode="create"),), key=key)
    again = other.commits.commit((file("/f", [chunk(1)], mode="create"),), key=key)
    assert again == first and again[0].generation == 1
    assert other.namespace.stat("/f").inode == first[0].inode
    with pytest.raises(AlreadyExists):  # without the key it is a new request
        other.commits.commit((file("/f", [chunk(1)], mode="create"),))
    assert _keys(engine) == 1


def test_a_repeated_rename_remove_and_mkdir_return_their_first_outcomes(
    two: tuple[Metadata, Metadata],
) -> None:
    one, other = two
    one.commits.commit((file("/a", [chunk(1)]),))
    moved, removed, made = new_key(), new_key(), new_key()
    assert one.namespace.rename("/a", "/b", key=moved).path == "/b"
    assert other.namespace.rename("/a", "/b", key=moved).path == "/b"  # not NotFound
    assert one.namespace.remove("/b", key=removed) == 1
    assert other.namespace.remove("/b", key=removed) == 1  # not NotFound
    assert one.namespace.mkdir("/d", key=made).kind == "directory"
    assert other.namespace.mkdir("/d", key=made).path == "/d"  # not AlreadyExists
    attrs = new_key()
    assert one.namespace.set_attributes("/d", Change(mode=0o700), key=attrs).mode == 0o700
    assert other.namespace.set_attributes("/d", Change(mode=0o700), key=attrs).mode == 0o700


def test_keys_in_a_commit_group_are_recorded_with_the_group(
    two: tuple[Metadata, Metadata], engine: Engine
) -> None:
    one, other = two
    a, b, c = new_key(), new_key(), new_key()
    batches = [
        (file("/g/a", [chunk(1)], mode="create"),),
        (file("/g/b", [chunk(2)], mode="create"),),
        (file("/g/a", [chunk(3)], mode="create"),),  # fails: /g/a exists by then
    ]
    results = one.commits.commit_group(batches, [a, b, c])
    assert isinstance(results[2], AlreadyExists)
    again = other.commits.commit_group(batches, [a, b, c])
    assert again[:2] == results[:2]  # the committed ones: their first outcome
    assert isinstance(again[2], AlreadyExists)  # the failed one ran again
    assert (
        other.namespace.stat("/g/a").generation == 1
        and other.namespace.stat("/g/b").generation == 1
    )
    assert _keys(engine) == 2  # a batch that failed recorded nothing


def test_a_key_twice_in_one_group_is_committed_once(two: tuple[Metadata, Metadata]) -> None:
    one, _ = two
    key = new_key()
    commit = (file("/once", [chunk(1)]),)
    first, second = one.commits.commit_group([commit, commit], [key, key])
    assert first == second
    assert one.namespace.stat("/once").generation == 1


def test_a_mutation_that_failed_records_nothing_so_its_repeat_runs(
    two: tuple[Metadata, Metadata], engine: Engine
) -> None:
    one, other = two
    key = new_key()
    with pytest.raises(NotFound):
        one.namespace.rename("/missing", "/there", key=key)
    assert _keys(engine) == 0
    other.commits.commit((file("/missing", [chunk(1)]),))
    assert other.namespace.rename("/missing", "/there", key=key).path == "/there"


def test_keys_past_their_lifetime_are_pruned_by_later_writes(
    two: tuple[Metadata, Metadata], engine: Engine
) -> None:
    one, _ = two
    old = time.time_ns() - int((KEY_LIFETIME_S + 60) * 1e9)
    fresh = time.time_ns() - int(60 * 1e9)
    for i in range(PRUNE_EXTRA + 5):
        engine.sql("INSERT INTO outcomes VALUES (%s, %s, %s)", f"old{i:03}", old, b"\x01")
    engine.sql("INSERT INTO outcomes VALUES (%s, %s, %s)", "young", fresh, b"\x01")
    one.namespace.mkdir("/p1", key=new_key())  # deletes up to 2 + PRUNE_EXTRA old keys
    assert _keys(engine) == 1 + 1 + 3
    one.namespace.mkdir("/p2", key=new_key())
    left = {k for (k,) in engine.sql("SELECT key FROM outcomes")}
    assert not [k for k in left if k.startswith("old")]
    assert "young" in left and len(left) == 3


def test_writes_without_keys_record_nothing(two: tuple[Metadata, Metadata], engine: Engine) -> None:
    one, _ = two
    one.commits.commit((file("/k", [chunk(1)]),))
    one.namespace.mkdir("/kd")
    one.namespace.rename("/k", "/kd/k")
    one.namespace.remove("/kd", recursive=True)
    assert _keys(engine) == 0
