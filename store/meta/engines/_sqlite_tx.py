"""The SQLite engine's transactions: ``SqlTx``'s queries in SQLite's words.

``SQLiteTx`` is what ``SQLiteRepository.read()`` and ``write()`` yield (see
``Tx`` in ``meta/_repo.py``). The queries are written once, in
``_sql_tx.py``; this class rewrites each (once, cached) into SQLite's
parameter style, a list parameter (``= ANY(%s)``) into a JSON array read
by ``json_each``, and ``GREATEST`` into SQLite's two-argument ``max``.
Many rows are a statement each (``executemany``): in process, a statement
costs no round trip.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from ..._types import ChunkProblem
from .._repo import Inode
from ._rows import entry_of
from ._sql_tx import JOINED_INODE, SqlTx
from ._sqlite_checks import inconsistencies

_TOKENS = re.compile(r"= ANY\(%(?:\((\w+)\))?s\)|%\((\w+)\)s|%s|%%|GREATEST\(")


@lru_cache(maxsize=512)
def sqlite_sql(query: str) -> str:
    """``query`` (psycopg's style, see ``_sql_tx.py``) as SQLite takes it."""

    def rewrite(match: re.Match[str]) -> str:
        token = match.group(0)
        if token.startswith("= ANY"):
            name = match.group(1)
            return f"IN (SELECT value FROM json_each({':' + name if name else '?'}))"
        if token.startswith("%("):
            return ":" + match.group(2)
        return {"%s": "?", "%%": "%", "GREATEST(": "max("}[token]

    return _TOKENS.sub(rewrite, query)


def _value(value: Any) -> Any:
    """A parameter as SQLite takes it: a list becomes a JSON array (for ``json_each``)."""
    return json.dumps(value) if isinstance(value, list) else value


def _params(params: Any) -> Any:
    if params is None:
        return ()
    if isinstance(params, Mapping):
        return {key: _value(value) for key, value in params.items()}
    return tuple(_value(value) for value in params)


class SQLiteTx(SqlTx):
    """A transaction on one connection (see ``Tx`` in ``_repo.py``)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def _execute(self, query: str, params: Any = None) -> sqlite3.Cursor:
        return self._db.execute(sqlite_sql(query), _params(params))

    def _many(self, query: str, rows: Sequence[Any]) -> int:
        if not rows:
            return 0
        return self._db.executemany(sqlite_sql(query), rows).rowcount

    def _in_transaction(self) -> bool:
        return self._db.in_transaction  # a full disk rolls back everything by itself

    def locked(self, inode: int) -> Inode | None:
        return self.get(inode)  # one writer at a time: nobody else changes it

    def locked_entry(self, parent: int, name: str) -> Inode | None:
        return self.lookup(parent, name)  # the same: nothing moves it meanwhile

    def locked_entries(self, names: Sequence[tuple[int, str]]) -> dict[tuple[int, str], Inode]:
        # One query for them all (nothing moves them meanwhile: one writer at a time).
        rows = self._db.execute(
            f"SELECT e.parent, e.name, e.sum, {JOINED_INODE} FROM json_each(?) AS w "
            "JOIN entries e ON e.parent = json_extract(w.value, '$[0]') "
            "AND e.name = json_extract(w.value, '$[1]') JOIN inodes i ON i.id = e.inode",
            (json.dumps(names),),
        ).fetchall()
        return {(row[0], row[1]): entry_of(row[0], row[1], row[2:], self.path_of) for row in rows}

    def inconsistencies(self, limit: int) -> list[ChunkProblem]:
        return inconsistencies(self._db, self.path_of, limit)
