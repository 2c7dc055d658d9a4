"""Node drains, removals and the records rebalancing reads, on both engines."""

from __future__ import annotations

import time

import pytest
from pg_kit import Engine, chunk, file

from graben.store import CannotPlace, NotFound, Refused
from graben.store._types import NodeState
from graben.store.meta import Metadata
from graben.store.meta._placement import place


def _joined(ns: Metadata, *ids: str) -> None:
    for node in ids:
        ns.nodes.heartbeat(NodeState(node, f"{node}:7070", "r", 10 << 30, 20 << 30))


def _standing(ns: Metadata) -> dict[str, tuple[str, int]]:
    return {n.id: (n.state, n.held) for n in ns.nodes.health().nodes}


def test_a_draining_node_keeps_its_state_through_heartbeats_and_counts_as_short(
    engine: Engine,
) -> None:
    ns = Metadata(engine.open())
    _joined(ns, "n1", "n2", "n3")
    ns.commits.commit((file("/f", [chunk(1), chunk(2)], nodes=("n1", "n2"), replication=2),))
    assert ns.drains.drain("n1").state == "draining"
    _joined(ns, "n1")  # a heartbeat leaves the state be
    assert _standing(ns)["n1"] == ("draining", 2)
    short = ns.records.degraded()
    assert [(d.live, d.draining) for d in short] == [(("n2",), ("n1",))] * 2
    with pytest.raises(CannotPlace, match="draining: n1"):
        place(ns.nodes.listed(), 3, "k", 10)
    assert ns.drains.drain("n1", undo=True).state == ""
    assert not ns.records.degraded()
    with pytest.raises(NotFound):
        ns.drains.drain("nobody")


def test_sweep_forgets_draining_copies_only_of_chunks_held_elsewhere(engine: Engine) -> None:
    ns = Metadata(engine.open())
    _joined(ns, "n1", "n2", "n3")
    ns.commits.commit((file("/two", [chunk(1)], nodes=("n1", "n2"), replication=1),))
    ns.commits.commit((file("/one", [chunk(2)], nodes=("n1",), replication=1),))
    ns.drains.drain("n1")
    fence = ns.repo.transact(lambda tx: tx.services.lease()).fence
    gone = ns.drains.sweep(ns.nodes.listed(), {chunk(2).id}, fence)
    assert gone == [(chunk(1).id, "n1")]
    assert _standing(ns)["n1"] == ("draining", 1)
    with engine.open().read() as tx:
        assert tx.nodes.held_bytes() == {"n1": 1000, "n2": 1000}
        assert [r.id for r in tx.nodes.movable("n2", "n3", 10)] == [chunk(1).id]
        assert tx.nodes.movable("n2", "n2", 10) == []


def test_a_node_is_removed_only_once_stopped_and_holding_no_only_copy(engine: Engine) -> None:
    ns = Metadata(engine.open(), heartbeat_timeout=0.2)
    _joined(ns, "n1", "n2")
    ns.commits.commit((file("/one", [chunk(1)], nodes=("n1",), replication=1),))
    ns.commits.commit((file("/two", [chunk(2)], nodes=("n1", "n2"), replication=1),))
    with pytest.raises(Refused, match="still running"):
        ns.drains.remove("n1")
    time.sleep(0.3)
    with pytest.raises(Refused, match=f"only copy .*{chunk(1).id}"):
        ns.drains.remove("n1")
    ns.drains.remove("n2")
    assert [n.id for n in ns.nodes.listed()] == ["n1"]
    assert ns.namespace.layout("/two").replicas == {chunk(2).id: ("n1",)}
