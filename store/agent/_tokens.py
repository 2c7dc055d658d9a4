"""Who may call the agent: the cluster's token, or a tenant's for the jobs in its prefix.

The cluster's own token (servers, operators, ranks holding the secret) may
make every call. A tenant's token may make a rank's calls (``RIGHTS``) for a
job whose root URL names a path at or below the token's prefix: ``r`` to
find and read back its steps, ``w`` to save, finish and drop them; never a
peer's calls nor ``status`` (the operator's, as on the metadata service).

The agent holds no tokens of its own: it asks a metadata service
(``graben agent serve --meta``). The tenant's token must be answered there
(the service refuses one that is unknown, revoked or expired), and the
cluster's token lists what it reaches. An answer, a refusal too, is kept
``REFRESH_S``, as the services keep theirs: a revocation holds here within
about that.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

from .. import _paths
from .._config import split_url
from .._errors import GrabenError, PermissionDenied
from .._types import TokenInfo
from ..transport import GetStoreId, ListTokens, RemoteMeta
from ..wire import auth

REFRESH_S = 0.5
"""How old an answer about a tenant's token may be."""
KEPT_MAX = 4096
"""Answers kept at most (a flood of made-up tokens costs a lookup each, no more)."""
ASK_S = 3.0
"""Seconds the metadata service has to answer about a token."""
_TENANT = re.compile(r"gbt_([0-9a-f]{12})_[0-9a-f]{64}")
"""A tenant's token, as ``meta/_tenants.py`` issues them: its id, then its secret."""
_RIGHTS = {"r": "read", "w": "write"}


class Tokens:
    """A call's token, resolved: ``None`` for the cluster's own, else the tenant's token."""

    def __init__(self, secret: bytes, meta: Sequence[tuple[str, int]] = ()) -> None:
        self._secret, self._meta = secret, tuple(meta)
        self._operator: RemoteMeta | None = None
        self._known: dict[str, tuple[float, TokenInfo | GrabenError]] = {}

    async def scope(self, token: str) -> TokenInfo | None:
        """``None`` for the cluster's token; a tenant's token's info if the metadata service
        knows it live; else ``PermissionDenied`` saying why."""
        if auth.is_client_token(self._secret, token):
            return None
        found = _TENANT.fullmatch(token)
        if found is None:
            auth.check_token(self._secret, token)  # refuses it, saying what to set
        if not self._meta:
            raise PermissionDenied(
                "this memory agent takes the cluster's token only: to take tenants' tokens "
                "it needs the metadata service (graben agent serve --meta HOST:PORT)"
            )
        at, known = self._known.get(token, (-1e9, None))
        if known is None or time.monotonic() - at > REFRESH_S:
            known = await self._ask(token, found[1] if found else "")
            if len(self._known) >= KEPT_MAX:
                self._known.clear()
            self._known[token] = (time.monotonic(), known)
        if isinstance(known, GrabenError):
            raise known
        return known

    async def _ask(self, token: str, ident: str) -> TokenInfo | GrabenError:
        """What the metadata service says of ``token`` (its refusal as a value)."""
        probe = RemoteMeta(self._meta, token, timeout=ASK_S, wait=ASK_S)
        try:
            await probe.request(GetStoreId())  # any live token may ask this; no other may
            if self._operator is None:
                operator = auth.client_token(self._secret)
                self._operator = RemoteMeta(self._meta, operator, timeout=ASK_S, wait=ASK_S)
            listed = await self._operator.request(ListTokens())
        except PermissionDenied as exc:
            return exc
        finally:
            await probe.close()
        for info in listed:
            if info.id == ident and not info.revoked:
                return info
        return PermissionDenied(f"token {ident} is not known to this cluster")

    async def close(self) -> None:
        if self._operator is not None:
            await self._operator.close()


def allow(info: TokenInfo, right: str, job: str) -> None:
    """``PermissionDenied`` unless the tenant's token ``info`` has ``right`` and reaches
    the path ``job`` (a checkpoint root's URL) names."""
    if right not in info.rights:
        raise PermissionDenied(
            f"token {info.id} has no {_RIGHTS[right]} right (it has {info.rights})", job
        )
    try:
        path = _paths.normalize(split_url(job)[1])
    except GrabenError:
        raise PermissionDenied(f"token {info.id} reaches {info.prefix} only", job) from None
    if not _paths.is_within(path, info.prefix):
        raise PermissionDenied(f"token {info.id} reaches {info.prefix} only", job)
