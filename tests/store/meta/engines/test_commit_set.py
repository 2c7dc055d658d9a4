"""A commit group's files go a statement per table, not per file, on both engines; and
what the group does is what committing its batches one by one would have done."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest
from pg_kit import Engine, chunk, file

from graben.store import AlreadyExists, DirectoryNotEmpty, NotADirectory, NotFound
from graben.store.meta import Metadata, _changes
from graben.store.meta.engines._statements import Statements


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How many statements (or statement batches) the engines are sent."""
    sent: Counter[str] = Counter()
    for name in ("execute", "many"):
        for cls in Statements.__subclasses__():
            real = getattr(cls, name)

            def counted(
                self: Statements, *args: object, _real: object = real, _n: str = name
            ) -> object:
                sent[_n] += 1
                return _real(self, *args)  # type: ignore[operator]

            monkeypatch.setattr(cls, name, counted)
    return sent


@pytest.mark.parametrize("count", [64, 256])
def test_a_group_of_new_files_costs_the_same_few_statements_whatever_its_size(
    engine: Engine, statements: Counter[str], count: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = Metadata(engine.open())
    ns.namespace.mkdir("/run")
    # The change feed forgets its oldest rows in one commit in 16, at random: not this one.
    monkeypatch.setattr(_changes, "random", SimpleNamespace(randrange=lambda n: 1))
    statements.clear()
    batches = [(file(f"/run/{i}", [chunk(i)]),) for i in range(count)]
    outcome = ns.commits.commit_group(batches, [f"key-{i}" for i in range(count)])
    assert all(isinstance(o, list) for o in outcome)
    assert sum(statements.values()) <= 17, statements  # 17th: chunks collected meanwhile
    assert len(ns.namespace.listdir("/run").entries) == count


def test_a_group_replaces_files_keeps_their_links_and_refuses_one_alone(engine: Engine) -> None:
    ns = Metadata(engine.open())
    ns.commits.commit((file("/d/a", [chunk(1)]), file("/d/b", [chunk(2)])))
    ns.namespace.link("/d/a", "/d/a-link")
    before = ns.namespace.stat("/d/a")
    outcome = ns.commits.commit_group(
        [
            (file("/d/a", [chunk(3)]),),  # replaces, and its other name sees it too
            (file("/d/b", [chunk(4)], mode="create"),),  # refused: the rest goes on
            (file("/d/c", [chunk(5)]), file("/d/a", [chunk(6)])),  # a path twice: the last wins
        ]
    )
    assert isinstance(outcome[1], AlreadyExists)
    assert ns.namespace.layout("/d/a").extents[0].chunk == chunk(6)
    assert ns.namespace.layout("/d/a-link").extents[0].chunk == chunk(6)
    assert ns.namespace.stat("/d/a").generation == before.generation + 2
    assert ns.namespace.layout("/d/b").extents[0].chunk == chunk(2)
    assert ns.namespace.layout("/d/c").extents[0].chunk == chunk(5)
    assert ns.records.check_metadata() == []
    assert engine.sql("SELECT refs FROM chunks WHERE id = %s", chunk(1).id) == [(0,)]


def test_files_and_a_move_commit_together_or_not_at_all(engine: Engine) -> None:
    """How a checkpoint is published: its last files and its name in one transaction."""
    ns = Metadata(engine.open())
    ns.commits.commit((file("/.step.saving/rank0", [chunk(1)]), file("/step/old", [chunk(9)])))
    last = (file("/.step.saving/.metadata", [chunk(2)]),)
    with pytest.raises(DirectoryNotEmpty):  # the old checkpoint is there, not to be replaced
        ns.namespace.rename("/.step.saving", "/step", files=last)
    assert [e.name for e in ns.namespace.listdir("/.step.saving").entries] == [
        "rank0"
    ]  # undone too
    ns.namespace.rename("/.step.saving", "/step", replace_tree=True, files=last)
    assert [e.name for e in ns.namespace.listdir("/step").entries] == [".metadata", "rank0"]
    assert ns.records.check_metadata() == []


def test_a_deep_path_is_found_in_one_statement(engine: Engine, statements: Counter[str]) -> None:
    ns = Metadata(engine.open())
    ns.commits.commit((file("/a/b/c/d/e/f/g/h", [chunk(1)]),))
    statements.clear()
    assert ns.namespace.stat("/a/b/c/d/e/f/g/h").size == chunk(1).length
    if engine.name == "postgresql":  # across a network: one round trip, not eight
        assert sum(statements.values()) == 1, statements
    with pytest.raises(NotADirectory):
        ns.namespace.stat("/a/b/c/d/e/f/g/h/i")
    with pytest.raises(NotFound):
        ns.namespace.stat("/a/b/c/x/e")
