"""A transaction's connection in its engine's words: what every concern's SQL runs on.

The concerns of a transaction (``_sql_tree.py``, ``_sql_files.py``, ``_sql_chunks.py``,
``_sql_stripes.py``, ``_sql_tenants.py``, ``_sql_records.py``) each hold their queries once,
in psycopg's parameter style (``%s``, ``%(name)s``) and in SQL both engines speak, and run
them on a ``Statements`` given to them. An engine gives its own: SQLite's rewrites each query
into its words (``_sqlite_tx.py``: ``= ANY(%s)`` takes a list, there a JSON array through
``json_each``; ``GREATEST(a, b)`` is its ``max``), PostgreSQL's runs them as written
(``_postgres_tx.py``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ..._types import ChunkProblem
from ._rows import PathOf


class Statements(ABC):
    """One connection in a transaction: an engine gives ``execute``, ``many``,
    ``in_transaction`` and ``inconsistencies``; the rest is derived from them."""

    @abstractmethod
    def execute(self, query: str, params: Any = None) -> Any:
        """Run one statement; its cursor."""

    @abstractmethod
    def many(self, query: str, rows: Sequence[Any]) -> int:
        """Run one statement for each parameter row; how many rows they changed."""

    @abstractmethod
    def in_transaction(self) -> bool:
        """Whether the transaction is still open (a savepoint is there to return to)."""

    @abstractmethod
    def inconsistencies(self, path_of: PathOf, limit: int) -> list[ChunkProblem]:
        """Up to ``limit`` contradictions in the engine's tables (``_checks.py``, in the
        engine's words), naming paths with ``path_of``."""

    def rows(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        """Run one statement; every row it returns."""
        return list(self.execute(query, params).fetchall())

    def one(self, query: str, params: Any = None) -> tuple[Any, ...] | None:
        """Run one statement; its first row, if any."""
        row: tuple[Any, ...] | None = self.execute(query, params).fetchone()
        return row

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """A nested unit: an exception in the block undoes the block's changes only."""
        self.execute("SAVEPOINT unit")
        try:
            yield
        except BaseException:
            if self.in_transaction():  # a lost connection or a full disk rolled back all
                self.execute("ROLLBACK TO SAVEPOINT unit")
                self.execute("RELEASE SAVEPOINT unit")
            raise
        self.execute("RELEASE SAVEPOINT unit")
