"""The metadata engines: where the namespace's transactions become durable.

Each engine implements ``meta._repo.Repository`` and checks its own tables
for fsck. Their SQL is written once: the transaction (``_sql_tx``), an
object per concern of ``meta._repo.Tx`` over the connection's statements
(``_statements``): ``_sql_tree``, ``_sql_files``, ``_sql_chunks``,
``_sql_stripes``, ``_sql_tenants``, ``_sql_records``; the schema's
migrations (``_schema``) and the cross-checks (``_checks``). Each engine
gives its statements and its own class only for a concern its dialect does
differently. SQLite (``_sqlite``: one file, WAL, one writer; ``_sqlite_tx``,
its words; ``_sqlite_checks``) serves one host. PostgreSQL (``_postgres``: a
pool, writers side by side, run again on a conflict; ``_postgres_tx``, many
rows in one statement; ``_postgres_schema``, its database and cross-checks)
serves several metadata services sharing one database; it needs psycopg, an optional
dependency, so the door names it only through ``open_postgres``
(``_optional``), which imports it when a ``postgresql://`` engine is
opened, and ``is_postgres`` (``_postgres_url``), which needs no psycopg.
``_backup`` backs an engine up while it serves (SQLite's backup API,
``pg_dump``) and restores one from a backup.

May import: the repository interface (``meta._repo``, the door of ``meta._repo_tree``
and ``meta._repo_records``) and the store's shared
modules; nothing else of the store.
"""

from ._backup import DEFAULT_KEEP_S, Backup, backup, restore
from ._optional import open_postgres
from ._postgres_url import is_postgres
from ._schema import SCHEMA_VERSION
from ._sqlite import SQLiteRepository

__all__ = [
    "DEFAULT_KEEP_S",
    "SCHEMA_VERSION",
    "Backup",
    "SQLiteRepository",
    "backup",
    "is_postgres",
    "open_postgres",
    "restore",
]
