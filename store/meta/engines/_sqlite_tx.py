"""The SQLite engine's transactions: the shared queries in SQLite's words.

``sqlite_tx`` makes what ``SQLiteRepository.read()`` and ``transact()`` give
(``SqlTx``, see ``Tx`` in ``meta/_repo.py``). The queries are written once, by
concern (``_sql_tx.py``); ``SQLiteStatements`` rewrites each (once, cached)
into SQLite's parameter style, a list parameter (``= ANY(%s)``) into a JSON
array read by ``json_each``, and ``GREATEST`` into SQLite's two-argument
``max``. Many rows are a statement each (``executemany``): in process, a
statement costs no round trip. With one writer at a time, nothing moves a row
it reads, so ``SQLiteTree`` reads where the shared tree locks.
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
from ._rows import PathOf, entry_of
from ._sql_tree import JOINED_INODE, SqlTree
from ._sql_tx import Parts, SqlTx
from ._sqlite_checks import inconsistencies
from ._statements import Statements

_TOKENS = re.compile(r"= ANY\(%(?:\((\w+)\))?s\)|%\((\w+)\)s|%s|%%|GREATEST\(")


@lru_cache(maxsize=512)
def sqlite_sql(query: str) -> str:
    """``query`` (psycopg's style, see ``_statements.py``) as SQLite takes it."""

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


class SQLiteStatements(Statements):
    """One connection's statements, in SQLite's words."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def execute(self, query: str, params: Any = None) -> sqlite3.Cursor:
        return self.db.execute(sqlite_sql(query), _params(params))

    def many(self, query: str, rows: Sequence[Any]) -> int:
        if not rows:
            return 0
        return self.db.executemany(sqlite_sql(query), rows).rowcount

    def in_transaction(self) -> bool:
        return self.db.in_transaction  # a full disk rolls back everything by itself

    def inconsistencies(self, path_of: PathOf, limit: int) -> list[ChunkProblem]:
        return inconsistencies(self.db, path_of, limit)


class SQLiteTree(SqlTree):
    """The tree with one writer at a time: nothing to lock, nothing moves meanwhile."""

    def locked(self, inode: int) -> Inode | None:
        return self.get(inode)  # one writer at a time: nobody else changes it

    def locked_entry(self, parent: int, name: str) -> Inode | None:
        return self.lookup(parent, name)  # the same: nothing moves it meanwhile

    def locked_entries(self, names: Sequence[tuple[int, str]]) -> dict[tuple[int, str], Inode]:
        # One query for them all (nothing moves them meanwhile: one writer at a time).
        rows = self.sql.rows(
            f"SELECT e.parent, e.name, e.sum, {JOINED_INODE} FROM json_each(%s) AS w "
            "JOIN entries e ON e.parent = json_extract(w.value, '$[0]') "
            "AND e.name = json_extract(w.value, '$[1]') JOIN inodes i ON i.id = e.inode",
            (json.dumps(names),),
        )
        return {(row[0], row[1]): entry_of(row[0], row[1], row[2:], self.path_of) for row in rows}


SQLITE = Parts(tree=SQLiteTree)
"""The concerns SQLite does its own way."""


def sqlite_tx(db: sqlite3.Connection) -> SqlTx:
    """A transaction on ``db``, which has begun one (see ``Tx`` in ``meta/_repo.py``)."""
    return SqlTx(SQLiteStatements(db), SQLITE)
