"""The metadata engines: where the namespace's transactions become durable.

Each engine implements ``meta._repo.Repository`` and checks its own tables
for fsck. Their SQL is written once: the transactions (``_sql_tx``), the
schema's migrations (``_schema``) and the cross-checks (``_checks``); each
engine overrides only what its dialect does differently. SQLite
(``_sqlite``: one file, WAL, one writer; ``_sqlite_tx``, its words;
``_sqlite_checks``) serves one host. PostgreSQL (``_postgres``: a pool,
writers side by side, run again on a conflict; ``_postgres_tx``, many rows
in one statement; ``_postgres_schema``, its database and cross-checks)
serves several metadata services sharing one database; it needs psycopg, an optional
dependency, so the door names it only through ``open_postgres``
(``_optional``), which imports it when a ``postgresql://`` engine is
opened, and ``is_postgres`` (``_postgres_url``), which needs no psycopg.

May import: the repository interface (``meta._repo``) and the store's shared
modules; nothing else of the store.
"""

from ._optional import open_postgres
from ._postgres_url import is_postgres
from ._sqlite import SQLiteRepository

__all__ = ["SQLiteRepository", "is_postgres", "open_postgres"]
