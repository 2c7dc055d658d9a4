"""The engines whose drivers are optional: imported only when one is opened.

psycopg is an optional dependency (``pip install 'graben[postgres]'``): the
store, its SQLite engine and the command line import without it, and only
opening a ``postgresql://`` engine needs it. Without it, that is an
``InvalidArgument`` saying what to install, not an ``ImportError``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._errors import InvalidArgument

if TYPE_CHECKING:
    from .._repo import Repository


def open_postgres(url: str, *, create: bool, migrate: bool = True) -> Repository:
    """``PostgresRepository(url, create=create, migrate=migrate)`` (``_postgres.py``)."""
    try:
        from ._postgres import PostgresRepository
    except ImportError as exc:
        raise InvalidArgument(
            f"PostgreSQL support is not installed ({exc.name} is missing): "
            "pip install 'graben[postgres]'"
        ) from None
    return PostgresRepository(url, create=create, migrate=migrate)
