"""A SQL transaction: the repository's concerns, each an object over one connection.

``SqlTx`` is ``Tx`` (``meta/_repo.py``) for both engines. It builds one object per
concern over the transaction's ``Statements`` (``_statements.py``) and hands each the
others it needs in its constructor: files make their inodes through the tree, stripes ask
the chunk layer which nodes hold a chunk. Each concern's SQL is written once
(``_sql_tree.py``, ``_sql_files.py``, ``_sql_chunks.py``, ``_sql_stripes.py``,
``_sql_tenants.py``, ``_sql_records.py``); where a dialect does one differently, its
engine names its own class for that concern in ``Parts`` (SQLite: ``_sqlite_tx.py``;
PostgreSQL: ``_postgres_tx.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from ..._types import ChunkProblem
from .._repo import Tree
from ._sql_chunks import SqlChunks
from ._sql_files import SqlFiles
from ._sql_records import SqlBadCopies, SqlFeed, SqlIdentity, SqlKeys, SqlNodes, SqlServices
from ._sql_stripes import SqlStripes
from ._sql_tenants import SqlQuotas, SqlTenants
from ._sql_tree import SqlTree
from ._statements import Statements


@dataclass(frozen=True, slots=True)
class Parts:
    """How an engine builds the concerns its dialect does its own way (the shared SQL's
    classes for the rest)."""

    tree: Callable[[Statements], SqlTree] = SqlTree
    """Names, inodes and their locks."""
    files: Callable[[Statements, Tree], SqlFiles] = SqlFiles
    """Extents and chunk references (given the tree)."""
    chunks: Callable[[Statements], SqlChunks] = SqlChunks
    """Chunks and their copies."""
    keys: Callable[[Statements], SqlKeys] = SqlKeys
    """Idempotency keys."""
    services: Callable[[Statements], SqlServices] = SqlServices
    """Services, the lease, the clock."""


class SqlTx:
    """A transaction on one connection (see ``Tx`` in ``meta/_repo.py``)."""

    def __init__(self, sql: Statements, parts: Parts) -> None:
        self.sql = sql
        self.tree = parts.tree(sql)
        self.files = parts.files(sql, self.tree)
        self.chunks = parts.chunks(sql)
        self.stripes = SqlStripes(sql, self.chunks)
        self.tenants = SqlTenants(sql)
        self.quotas = SqlQuotas(sql)
        self.feed = SqlFeed(sql)
        self.keys = parts.keys(sql)
        self.nodes = SqlNodes(sql)
        self.services = parts.services(sql)
        self.bad = SqlBadCopies(sql)
        self.identity = SqlIdentity(sql)

    def savepoint(self) -> AbstractContextManager[None]:
        return self.sql.savepoint()

    def inconsistencies(self, limit: int) -> list[ChunkProblem]:
        return self.sql.inconsistencies(self.tree.path_of, limit)
