"""Stores made by every earlier schema version open with today's code, migrate, and read
back every byte.

The embedded stores in ``tests/fixtures/schemas`` were each made by graben's own code
at that version (``make.py`` there says how, and what each holds). PostgreSQL stores
were never made by old code for these tests: instead, a database taken up to each
version by the migrations of that time and then opened by today's code must end with
the same tables, columns and indexes as one made new (on SQLite too).
"""

from __future__ import annotations

import importlib.util
import sqlite3
import tarfile
from pathlib import Path
from types import ModuleType

import pytest
from pg_kit import (  # noqa: F401  (fixtures)
    MIGRATIONS,
    Engine,
    engine_fixture,
    pg_database_fixture,
    pg_server_fixture,
    pg_url_fixture,
)

import graben.store as gs
from graben.store.meta.engines._schema import POSTGRES, SQLITE, scripts

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "schemas"
VERSIONS = sorted(int(p.name[1:].split(".")[0]) for p in FIXTURES.glob("v*.tar.gz"))


def _recipe() -> ModuleType:
    """``make.py``, which says what every fixture holds."""
    spec = importlib.util.spec_from_file_location("schema_fixtures", FIXTURES / "make.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RECIPE = _recipe()


def unpack(version: int, into: Path) -> Path:
    """The store of fixture ``version``, unpacked under ``into``."""
    with tarfile.open(FIXTURES / f"v{version}.tar.gz") as tar:
        tar.extractall(into / "store", filter="data")
    return into / "store"


def tree(client: gs.Client, path: str = "/") -> dict[str, str]:
    """Every name under ``path``, with its kind."""
    found = {}
    for info in client.ls(path):
        found[info.path] = info.kind
        if info.kind == "directory":
            found.update(tree(client, info.path))
    return found


def test_every_version_main_had_has_a_fixture() -> None:
    # 13 to 15 were never on main: four branches' 13s came in together as 13 to 16
    assert [*range(1, 13), 16] == VERSIONS
    assert VERSIONS[-1] <= MIGRATIONS


@pytest.mark.parametrize("version", VERSIONS)
def test_a_store_made_at_an_earlier_version_migrates_and_reads_back(
    version: int, tmp_path: Path
) -> None:
    store = unpack(version, tmp_path)
    with sqlite3.connect(store / "meta.db") as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == version
    expected = RECIPE.expected()
    with gs.connect(store) as client:
        with sqlite3.connect(store / "meta.db") as db:
            assert db.execute("PRAGMA user_version").fetchone()[0] == MIGRATIONS
        files = dict.fromkeys(expected, "file")
        assert tree(client) == files | dict.fromkeys(RECIPE.DIRECTORIES, "directory")
        for path, data in expected.items():
            assert client.stat(path).size == len(data)
            assert client.get(path) == data, path
        new = RECIPE.content("/after/upgrade.bin", 3 * RECIPE.CHUNK_SIZE + 17)
        client.put("/after/upgrade.bin", new)
        assert client.get("/after/upgrade.bin") == new
        report = client.fsck()
        assert report.ok, report.problems
    with gs.connect(store) as again:  # and it opens as any store of today does
        assert again.get("/multi.bin") == expected["/multi.bin"]


# -- the schema a migrated store ends with ------------------------------------------------


def catalog(engine: Engine) -> set[tuple[object, ...]]:
    """Every table's columns (name, type, null, default) and every index, as the engine
    lists them."""
    if engine.name == "sqlite":
        tables = [t for (t,) in engine.sql("SELECT name FROM sqlite_master WHERE type = 'table'")]
        columns = {(t, *row[1:5]) for t in tables for row in engine.sql(f"PRAGMA table_xinfo({t})")}
        indexes = engine.sql("SELECT name, sql FROM sqlite_master WHERE type = 'index'")
        return columns | {("index", *row) for row in indexes}
    columns = engine.sql(
        "SELECT table_name, column_name, data_type, is_nullable, column_default, "
        "is_generated, generation_expression FROM information_schema.columns "
        "WHERE table_schema = current_schema()"
    )
    indexes = engine.sql(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema()"
    )
    return set(columns) | {("index", *row) for row in indexes}


def take_up_to(engine: Engine, version: int) -> None:
    """Run migrations 1 to ``version`` on the empty database, as graben of that day did."""
    words = SQLITE if engine.name == "sqlite" else POSTGRES
    if engine.name == "postgresql":
        engine.sql("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        engine.sql("INSERT INTO schema_version VALUES (0)")
    for _, statements in scripts(words, 0)[:version]:
        for statement in statements:
            engine.sql(statement)
    engine.set_version(version)


@pytest.mark.parametrize("version", range(1, MIGRATIONS))
def test_a_store_migrated_from_each_version_has_the_schema_of_a_new_one(
    engine: Engine, version: int, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    take_up_to(engine, version)
    engine.open(create=False)
    assert engine.version() == MIGRATIONS
    if engine.name == "sqlite":
        new = Engine("sqlite", str(tmp_path / "new.db"))
    else:
        server = request.getfixturevalue("pg_server")
        name = server.create_database()
        request.addfinalizer(lambda: server.drop_database(name))
        new = Engine("postgresql", server.url(name))
    try:
        new.open()
        assert catalog(engine) == catalog(new)
    finally:
        new.close()


def test_a_backup_never_migrates_the_engine_it_copies(tmp_path: Path) -> None:
    """Services of the older graben still run on it: a newer graben's backup refuses,
    saying why, and leaves the schema as it was; a restore of such a copy, its services
    stopped, brings it up to date."""
    from graben.store.meta import backup, restore

    store = unpack(VERSIONS[-1], tmp_path)
    engine = f"sqlite:///{store / 'meta.db'}"
    with pytest.raises(gs.GrabenError, match=r"older than this graben's.*does not migrate"):
        backup(engine, tmp_path / "b.db")
    with sqlite3.connect(store / "meta.db") as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == VERSIONS[-1]
    assert not (tmp_path / "b.db").exists()
    restore(f"sqlite:///{tmp_path / 'restored.db'}", store / "meta.db")
    with sqlite3.connect(tmp_path / "restored.db") as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == MIGRATIONS
