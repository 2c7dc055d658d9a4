"""The leader's lease and its fence, on each engine: two services' repositories on one store.

Every test runs on SQLite and on PostgreSQL (``engine`` in ``pg_kit.py``);
each "service" here is a repository of its own on the shared store, as two
``meta serve`` processes would hold.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from pg_kit import Engine, chunk, file

from graben.store._types import NodeState, ServiceState
from graben.store.meta import SCHEMA_VERSION, Metadata
from graben.store.meta._leader import PRUNE_S, Deposed, Leadership, beat, resign


def _me(name: str) -> ServiceState:
    return ServiceState(name, f"{name}.example:7100", "test", 0.0, 0.0, SCHEMA_VERSION)


def _replicas(engine: Engine, chunk_id: str) -> list[str]:
    return [n for (n,) in engine.sql("SELECT node FROM replicas WHERE chunk = %s", chunk_id)]


def test_one_service_holds_the_lease_and_renews_it_under_one_fence(engine: Engine) -> None:
    a, b = engine.open(), engine.open()
    first = beat(a, _me("a"), 5.0)
    assert (first.holder, first.fence) == ("a", 1)
    assert beat(b, _me("b"), 5.0).holder == "a"  # not expired: b waits
    again = beat(a, _me("a"), 5.0)
    assert (again.holder, again.fence) == ("a", 1)
    assert again.expires >= first.expires


def test_a_lapsed_lease_passes_on_and_the_old_fence_writes_nothing(engine: Engine) -> None:
    a, b = Metadata(engine.open()), Metadata(engine.open())
    c = chunk(1)
    a.commits.commit((file("/f", [c], nodes=("n1", "n2"), replication=3),))
    a.commits.commit((file("/g", [chunk(2)], nodes=("n1",), replication=1),))
    old = beat(a.repo, _me("a"), 0.2)
    time.sleep(0.3)
    new = beat(b.repo, _me("b"), 5.0)
    assert (new.holder, new.fence) == ("b", old.fence + 1)

    with pytest.raises(Deposed, match=f"fence {old.fence}.*service b.*fence {new.fence}"):
        a.records.record_copies({c.id: ("n3",)}, old.fence)
    with pytest.raises(Deposed):
        a.records.report_bad(chunk(2).id, "n1", "crc mismatch", old.fence)
    assert sorted(_replicas(engine, c.id)) == ["n1", "n2"]
    assert _replicas(engine, chunk(2).id) == ["n1"]
    assert a.records.bad_count() == 0

    b.records.record_copies({c.id: ("n3",)}, new.fence)  # the leader's own write goes through
    assert sorted(_replicas(engine, c.id)) == ["n1", "n2", "n3"]
    assert beat(a.repo, _me("a"), 5.0).holder == "b"  # the old holder does not take it back


def test_a_service_that_stops_cleanly_hands_the_lease_on_at_once(engine: Engine) -> None:
    a, b = engine.open(), engine.open()
    beat(a, _me("a"), 60.0)
    beat(b, _me("b"), 60.0)
    resign(a, "a")
    taken = beat(b, _me("b"), 60.0)
    assert (taken.holder, taken.fence) == ("b", 2)
    assert [s.id for s in Metadata(b).nodes.health().services] == ["b"]


def test_reported_damage_waits_in_the_engine_for_whichever_service_leads(
    engine: Engine,
) -> None:
    a, b = Metadata(engine.open()), Metadata(engine.open())
    c = chunk(1)
    a.commits.commit((file("/f", [c], nodes=("n1", "n2")),))
    a.records.report_bad(c.id, "n2", "crc mismatch")  # told to one service ...
    assert b.records.bad_copies() == [(c.id, "n2", "crc mismatch")]  # ... seen by the other
    assert b.nodes.health().bad == 1
    lease = beat(b.repo, _me("b"), 5.0)
    b.records.forget_bad(c.id, "n2", lease.fence)
    assert a.nodes.health().bad == 0


def test_health_shows_the_services_the_leader_and_the_engine(engine: Engine) -> None:
    ns = Metadata(engine.open())
    ns.nodes.heartbeat(NodeState("n1", "127.0.0.1:9001", "r1", 10, 20))
    beat(ns.repo, _me("a"), 5.0)
    beat(engine.open(), _me("b"), 5.0)
    beat(engine.open(), _me("old"), 5.0)
    engine.sql("UPDATE services SET last_seen = last_seen - 30 WHERE id = 'old'")
    health = ns.nodes.health()
    assert [(s.id, s.address, s.alive) for s in health.services] == [
        ("a", "a.example:7100", True),
        ("b", "b.example:7100", True),
        ("old", "old.example:7100", False),
    ]
    assert (health.leader, health.fence) == ("a", 1)
    location = ns.repo.location
    assert location == health.engine
    if engine.name == "sqlite":
        assert location == f"sqlite://{engine.location}"
    else:
        assert location.startswith("postgresql://graben@127.0.0.1:")
        assert ":" + engine.location.split(":")[2].split("@")[0] + "@" not in location
    engine.sql("UPDATE services SET last_seen = last_seen - %s WHERE id = 'old'", PRUNE_S)
    beat(ns.repo, _me("a"), 5.0)
    assert [s.id for s in ns.nodes.health().services] == ["a", "b"]


def test_a_leader_that_cannot_renew_stops_before_another_can_take_over(engine: Engine) -> None:
    async def run() -> None:
        a = Leadership(engine.open(), _me("a"), lease_s=1.0)
        await a.beat()
        assert a.leading and a.check() == 1
        other = engine.open()
        while (lease := beat(other, _me("b"), 1.0)).holder != "b":
            await asyncio.sleep(0.02)  # a beats no more: its lease lapses
        assert lease.fence == 2
        assert not a.leading
        with pytest.raises(Deposed):
            a.check()
        await a.beat()  # it learns who leads now, and does not take the lease back
        assert not a.leading
        await a.close()

    asyncio.run(run())
