"""Tenants and their tokens, as the metadata engine keeps them.

An operator (holding the cluster
secret) adds a tenant with its root directory and the root's quota
(``add_tenant``), then issues the tenant tokens (``issue``), each bound to a
prefix within the root, rights (``r`` read, ``w`` write, ``a`` admin: classes
and quotas below the prefix) and an expiry. A token is
``gbt_<id>_<secret>``: the engine keeps the id, what it is bound to and the
SHA-256 of the secret, never the secret (256 random bits: a plain hash is
enough, no password stretching), so a copy of the database issues no
tokens. The token's text is in the reply that issues it and nowhere else:
``token ls`` shows ids.
"""

from __future__ import annotations

import hashlib
import math
import re
import secrets
import time

from .. import _paths
from .._errors import AlreadyExists, InvalidArgument, NotFound
from .._types import QuotaState, TokenInfo
from ..transport import (
    AddTenant,
    IssueToken,
    ListTenants,
    ListTokens,
    RevokeTokens,
    WhoAmI,
)
from ..transport._replies import Issued
from ._idempotency import write_once
from ._operations import handles
from ._quotas import Quotas
from ._repo import Repository, TokenRow, Tx
from ._walk import ensure_dirs

PREFIX = "gbt_"
"""How a tenant's token begins (the cluster's own token is 64 hex digits)."""
RIGHTS = "rwa"
MAX_TTL_S = 10 * 365 * 86400.0
"""The longest a token may last: ten years."""
_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}")
_TOKEN = re.compile(r"gbt_([0-9a-f]{12})_([0-9a-f]{64})")


def digest(secret: str) -> str:
    """What the engine keeps of a token's secret."""
    return hashlib.sha256(secret.encode()).hexdigest()


def parse_token(token: str) -> tuple[str, str] | None:
    """A tenant token's (id, secret); ``None`` if ``token`` is not one."""
    found = _TOKEN.fullmatch(token)
    return None if found is None else (found.group(1), found.group(2))


def check_rights(rights: str) -> str:
    """``rights`` in canonical order (``rw``, ``rwa``, ...); ``InvalidArgument`` if none
    or unknown."""
    if not rights or set(rights) - set(RIGHTS):
        raise InvalidArgument(f"rights are some of r (read), w (write), a (admin), not {rights!r}")
    return "".join(r for r in RIGHTS if r in rights)


class Tenants:
    """Tenant and token operations over a repository; a tenant's root quota is set
    through ``quotas``."""

    def __init__(self, repo: Repository, quotas: Quotas) -> None:
        self.repo = repo
        self._quotas = quotas

    @handles(AddTenant)
    def add_tenant(
        self,
        name: str,
        root: str,
        max_bytes: int = 0,
        max_physical: int = 0,
        max_files: int = 0,
        *,
        key: str = "",
    ) -> QuotaState:
        """Add a tenant: its root directory made (with parents), and the root's quota (0:
        no limit of that kind, usage counted all the same)."""
        if not _NAME.fullmatch(name):
            raise InvalidArgument(
                f"a tenant's name is 1 to 63 of a-z, 0-9, '_', '.', '-', not {name!r}"
            )
        parts = _paths.split(root)
        clean = _paths.join_parts(parts)
        if not parts:
            raise InvalidArgument("a tenant's root is a directory below /", clean)

        def add(tx: Tx) -> None:
            known = tx.tenants.tenants()
            if name in known:
                raise AlreadyExists(f"tenant {name} exists (root {known[name]})", clean)
            for other, at in known.items():
                if _paths.is_within(clean, at) or _paths.is_within(at, clean):
                    raise InvalidArgument(f"{clean} overlaps tenant {other}'s root {at}", clean)
            ensure_dirs(tx, parts, clean)
            tx.tenants.add_tenant(name, clean, time.time())

        write_once(self.repo, key, type(None), add)
        return self._quotas.set_quota(clean, max_bytes, max_physical, max_files, tenant=name)

    @handles(ListTenants)
    def tenants(self) -> dict[str, str]:
        """Every tenant's root, by name."""
        with self.repo.read() as tx:
            return tx.tenants.tenants()

    @handles(IssueToken)
    def issue(self, tenant: str, prefix: str, rights: str, ttl_s: float) -> Issued:
        """A new token of ``tenant`` for ``prefix`` (within its root; ``""``: the root),
        with ``rights``, lasting ``ttl_s`` seconds. Its text is in this reply only."""
        rights = check_rights(rights)
        if not (math.isfinite(ttl_s) and 0 < ttl_s <= MAX_TTL_S):
            raise InvalidArgument(f"a token lasts 1 s to 10 years, not {ttl_s!r} s")
        with self.repo.read() as tx:
            root = tx.tenants.tenants().get(tenant)
        if root is None:
            raise NotFound(f"no tenant {tenant!r}: add it first (graben tenant add)")
        clean = _paths.normalize(prefix or root)
        if not _paths.is_within(clean, root):
            raise InvalidArgument(f"tenant {tenant}'s tokens reach within {root} only", clean)
        ident, secret, now = secrets.token_hex(6), secrets.token_hex(32), time.time()
        info = TokenInfo(ident, tenant, clean, rights, now + ttl_s, now)
        self.repo.transact(lambda tx: tx.tenants.add_token((info, digest(secret))))
        return Issued(info, f"{PREFIX}{ident}_{secret}")

    def token_rows(self, ids: list[str] | None) -> list[TokenRow]:
        """The tokens with these ids (every one: ``None``), with their secrets' digests."""
        with self.repo.read() as tx:
            return tx.tenants.tokens(ids)

    @handles(ListTokens)
    def tokens(self, tenant: str = "") -> list[TokenInfo]:
        """Every token (of ``tenant``), revoked and expired ones too, never a secret."""
        with self.repo.read() as tx:
            rows = tx.tenants.tokens()
        return [info for info, _ in rows if not tenant or info.tenant == tenant]

    @handles(RevokeTokens)
    def revoke(self, ids: tuple[str, ...], tenant: str = "") -> int:
        """Revoke these tokens, or every token of ``tenant``; how many were live."""
        if not ids and not tenant:
            raise InvalidArgument("name the tokens to revoke, or their tenant")
        with self.repo.read() as tx:
            known = {info.id for info, _ in tx.tenants.tokens(ids)}
        if missing := sorted(set(ids) - known):
            raise NotFound(f"no token {missing[0]}")
        now = time.time()
        count: int = self.repo.transact(lambda tx: tx.tenants.revoke(ids, tenant, now))
        return count

    @handles(WhoAmI)
    def whoami(self) -> TokenInfo | None:
        """The cluster's own token: ``None`` (a tenant's is answered from its scope,
        ``_scopes.narrow``)."""
        return None
