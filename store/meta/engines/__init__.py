"""The metadata engines: where the namespace's transactions become durable.

Each engine implements ``meta._repo.Repository`` and checks its own tables
for fsck (``_sqlite_checks``). SQLite (``_sqlite``: one file, WAL) is the
one engine today; PostgreSQL, for many metadata hosts, goes beside it.

May import: the repository interface (``meta._repo``) and the store's shared
modules; nothing else of the store.
"""

from ._sqlite import SQLiteRepository

__all__ = ["SQLiteRepository"]
