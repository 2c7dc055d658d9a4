"""The client API's conformance suite again, with PostgreSQL as the engine.

Every test of ``test_store_api.py`` that takes a ``client`` runs here too,
on two stores whose metadata lives in PostgreSQL: the embedded store's
namespace logic over the PostgreSQL repository (through the client's
transport seam), and a real cluster whose metadata service was started with
``--engine postgresql://...``.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_store_api
from pg_kit import PgServer
from store_kit import SMALL_CHUNK

from graben.store import AsyncClient, Client, connect
from graben.store._config import Options
from graben.store.embedded._store import LocalChunks, LocalMeta
from graben.store.meta import Metadata
from graben.store.meta.engines._postgres import PostgresRepository
from graben.store.node._chunkstore import LocalChunkStore

globals().update(
    (name, test)
    for name, test in vars(test_store_api).items()
    if name.startswith("test_") and "client" in inspect.signature(test).parameters
)


def _embedded(url: str, root: Path) -> Client:
    """The embedded store's parts, with the namespace over PostgreSQL."""
    chunks = LocalChunkStore(root / "chunks")
    meta = LocalMeta(Metadata(PostgresRepository(url, create=True)), chunks.capacity)
    aio = AsyncClient.over(
        meta, LocalChunks(chunks, 4), Options(chunk_size=SMALL_CHUNK), "embedded on PostgreSQL"
    )
    return Client.wrap(aio)


@pytest.fixture(params=["embedded", "cluster"])
def client(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Client]:
    """A client on each kind of store, both with their metadata in PostgreSQL."""
    if request.param == "embedded":
        pg_server: PgServer = request.getfixturevalue("pg_server")
        database = pg_server.create_database()
        try:
            with _embedded(pg_server.url(database), tmp_path) as c:
                yield c
        finally:
            pg_server.drop_database(database)
        return
    with connect(request.getfixturevalue("pg_cluster"), chunk_size=SMALL_CHUNK) as c:
        for entry in c.ls("/"):  # each test starts from an empty namespace
            c.rm(entry.path, recursive=True)
        yield c


def test_the_suite_came_along() -> None:
    """The import above found the suite (a rename there must not empty this file)."""
    assert sum(name.startswith("test_") for name in globals()) > 25
