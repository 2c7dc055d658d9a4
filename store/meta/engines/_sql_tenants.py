"""Tenants, their tokens and the quotas of directories, as SQL written once for every
engine.

``SqlTenants`` (``Tenants`` in ``meta/_repo_records.py``) keeps the ``tenants`` and
``tokens`` tables, ``SqlQuotas`` (``Quotas``) the ``quotas`` table, each over a
transaction's ``Statements``. A quota's row carries the usage
of its directory's tree, moved by ``x = x + n`` under the row's lock in the
transaction that changes the tree, so writers of every service add up.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..._types import QuotaState, TokenInfo
from .._repo import TokenRow
from ._statements import Statements

QUOTA_ROW = "path, tenant, max_bytes, max_physical, max_files, bytes, physical, files"
TOKEN_ROW = "id, tenant, prefix, rights, expires, made, revoked, digest"
WITHIN = "(path = %s OR (path > %s AND path < %s))"
"""A path and everything below it: names after ``p/`` and before ``p0`` (``0`` follows
``/`` in byte order)."""


def within(path: str) -> tuple[str, str, str]:
    """``WITHIN``'s parameters for ``path``."""
    base = path.rstrip("/")
    return path, base + "/", base + "0"


class SqlTenants:
    """Tenants and tokens (see ``Tenants`` in ``meta/_repo_records.py``)."""

    def __init__(self, sql: Statements) -> None:
        self.sql = sql

    def add_tenant(self, name: str, root: str, made: float) -> bool:
        if self.sql.rows("SELECT 1 FROM tenants WHERE name = %s", (name,)):
            return False
        self.sql.execute(
            "INSERT INTO tenants (name, root, made) VALUES (%s, %s, %s)", (name, root, made)
        )
        return True

    def tenants(self) -> dict[str, str]:
        return {str(n): str(r) for n, r in self.sql.rows("SELECT name, root FROM tenants")}

    def add_token(self, row: TokenRow) -> None:
        info, digest = row
        self.sql.execute(
            f"INSERT INTO tokens ({TOKEN_ROW}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            (info.id, info.tenant, info.prefix, info.rights, info.expires, info.made, 0.0, digest),
        )

    def tokens(self, ids: Iterable[str] | None = None) -> list[TokenRow]:
        if ids is None:
            rows = self.sql.rows(f"SELECT {TOKEN_ROW} FROM tokens ORDER BY tenant, made")
        else:
            rows = self.sql.rows(f"SELECT {TOKEN_ROW} FROM tokens WHERE id = ANY(%s)", (list(ids),))
        return [_token(row) for row in rows]

    def revoke(self, ids: Sequence[str], tenant: str, now: float) -> int:
        """Revoke these tokens, or every token of ``tenant``; how many were live."""
        which, param = ("tenant = %s", tenant) if tenant else ("id = ANY(%s)", list(ids))
        found = self.sql.rows(
            f"UPDATE tokens SET revoked = %s WHERE {which} AND revoked = 0 RETURNING id",
            (now, param),
        )
        return len(found)


class SqlQuotas:
    """Quotas and their usage (see ``Quotas`` in ``meta/_repo_records.py``)."""

    def __init__(self, sql: Statements) -> None:
        self.sql = sql

    def quotas(self, paths: Iterable[str] | None = None) -> list[QuotaState]:
        if paths is None:
            rows = self.sql.rows(f"SELECT {QUOTA_ROW} FROM quotas ORDER BY path")
        else:
            rows = self.sql.rows(
                f"SELECT {QUOTA_ROW} FROM quotas WHERE path = ANY(%s) ORDER BY path",
                (list(paths),),
            )
        return [_quota(row) for row in rows]

    def quotas_within(self, path: str) -> list[QuotaState]:
        rows = self.sql.rows(
            f"SELECT {QUOTA_ROW} FROM quotas WHERE {WITHIN} ORDER BY path", within(path)
        )
        return [_quota(row) for row in rows]

    def set_quota(self, quota: QuotaState) -> None:
        self.sql.execute("DELETE FROM quotas WHERE path = %s", (quota.path,))
        self.sql.execute(
            f"INSERT INTO quotas ({QUOTA_ROW}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            (
                quota.path,
                quota.tenant,
                quota.max_bytes,
                quota.max_physical,
                quota.max_files,
                quota.bytes,
                quota.physical,
                quota.files,
            ),
        )

    def drop_quotas(self, path: str, *, tree: bool = True) -> int:
        """Forget the quota at ``path``, and (``tree``) those below it; how many."""
        where, params = (WITHIN, within(path)) if tree else ("path = %s", (path,))
        return len(self.sql.rows(f"DELETE FROM quotas WHERE {where} RETURNING path", params))

    def move_quotas(self, src: str, dst: str) -> None:
        """The quotas at and below ``src`` are now at and below ``dst`` (a rename)."""
        self.sql.execute(
            f"UPDATE quotas SET path = %s || substr(path, %s) WHERE {WITHIN}",
            (dst, len(src) + 1, *within(src)),
        )

    def add_usage(self, path: str, files: int, size: int, physical: int) -> QuotaState | None:
        rows = self.sql.rows(
            "UPDATE quotas SET files = files + %s, bytes = bytes + %s, physical = physical + %s "
            f"WHERE path = %s RETURNING {QUOTA_ROW}",
            (files, size, physical, path),
        )
        return _quota(rows[0]) if rows else None


def _quota(row: tuple[Any, ...]) -> QuotaState:
    path, tenant, *numbers = row
    return QuotaState(str(path), str(tenant), *(int(n) for n in numbers))


def _token(row: tuple[Any, ...]) -> TokenRow:
    id_, tenant, prefix, rights, expires, made, revoked, digest = row
    info = TokenInfo(
        str(id_), str(tenant), str(prefix), str(rights), float(expires), float(made), revoked > 0
    )
    return info, str(digest)
