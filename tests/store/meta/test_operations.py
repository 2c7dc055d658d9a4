"""Every metadata request is registered once: its rule with its type, its handler beside
its code; what the service, the embedded store, the tenants' checks and the client's
retries do with a request follows from that."""

from __future__ import annotations

from pathlib import Path

import pytest

from graben.store.meta import Metadata, MetaService, SQLiteRepository
from graben.store.meta._operations import Handlers, handles
from graben.store.transport import (
    ANY,
    OPERATOR,
    AddTenant,
    Commit,
    Grant,
    Repeat,
    Stat,
    request_types,
    with_key,
)


@pytest.fixture
def metadata(tmp_path: Path) -> Metadata:
    return Metadata(SQLiteRepository(tmp_path / "meta.db", create=True))


def test_every_request_has_its_own_rule() -> None:
    for kind in request_types():
        assert "rule" in vars(kind), f"{kind.__name__} declares no rule of its own"
        rule = kind.rule
        assert rule.right in ("r", "w", "a", ANY, OPERATOR), kind.__name__
        keyed = rule.repeat is Repeat.KEYED
        assert keyed == bool({"key", "keys"} & set(kind.__struct_fields__)), kind.__name__
        assert not (keyed and rule.reads), f"{kind.__name__} only reads yet carries a key"


def test_every_request_has_one_handler_in_the_service(metadata: Metadata) -> None:
    """A request no component handles would be refused as unknown by every service."""
    answered = metadata.handlers.kinds() | MetaService.ANSWERED_HERE
    assert sorted(k.__name__ for k in request_types() if k not in answered) == []
    assert not metadata.handlers.kinds() & MetaService.ANSWERED_HERE - {Commit}


def test_a_handler_runs_with_the_request_s_fields(metadata: Metadata) -> None:
    assert metadata.execute(Stat("/")).kind == "directory"
    made = metadata.execute(with_key(AddTenant("t", "/teams/t", max_files=3)))
    assert (made.path, made.tenant, made.max_files) == ("/teams/t", "t", 3)
    assert metadata.execute(Stat("/teams/t")).kind == "directory"


def test_a_handler_whose_parameters_are_not_the_request_s_fields_is_refused() -> None:
    with pytest.raises(TypeError, match="must be the request's fields"):

        class Wrong:
            @handles(Stat)
            def stat(self, name: str) -> None: ...

    class Twice:
        @handles(Grant)
        def one(self, chunks: tuple[str, ...], op: str) -> None: ...

        @handles(Grant)
        def two(self, chunks: tuple[str, ...], op: str) -> None: ...

    with pytest.raises(TypeError, match="two handlers"):
        Handlers(Twice())
