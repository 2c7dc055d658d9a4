"""The capabilities a metadata service hands out: who may read, write or delete a
chunk (or a piece of one) on a data node, signed with the cluster secret.

Placements come with write capabilities, layouts and fsck's chunk pages with
read capabilities (for each erasure-coded chunk's pieces too), and ``Grant``
hands out fresh ones, refusing a delete of anything the metadata names and a
write of a chunk a live file uses. Every capability names the store.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from msgspec.structs import replace

from .._errors import PermissionDenied
from .._types import Capability, FileLayout, Op, Stripe
from ..transport import ChunkPage, Grant, Placement, Prepare, Request
from ..wire import auth
from ._chunks import ChunkRecords
from ._policy import Policy

TENANT_TTL_S = 10.0
"""How long a tenant's capabilities last: what a revoked token's reads and writes already
under way may still do on the data nodes, which never see tokens. Clients ask for fresh
ones at half their life, so hosts' clocks must agree within a few seconds."""


class Capabilities:
    """Mints capabilities for one store's chunks."""

    def __init__(self, secret: bytes, policy: Policy, records: ChunkRecords) -> None:
        self._secret, self._policy, self._records = secret, policy, records

    def caps(
        self, chunks: Iterable[str], op: Op, ttl: float = auth.GRANT_TTL_S
    ) -> list[Capability]:
        """One capability per chunk id for ``op``, valid for ``ttl`` seconds."""
        now, store = time.time(), self._policy.store_id
        return [auth.grant(self._secret, c, op, ttl, now, store=store) for c in chunks]

    def grant(self, request: Grant, ttl: float = auth.GRANT_TTL_S) -> list[Capability]:
        """Runs on an engine thread: a delete is granted only for chunks no metadata names,
        a write only for chunks no live file uses (a live chunk never changes)."""
        if request.op == "delete" and (named := self._records.known(request.chunks)):
            raise PermissionDenied(
                f"chunk {min(named)} is in use or tracked; only orphan copies may be deleted"
            )
        if request.op == "write" and (live := self._records.live(request.chunks)):
            raise PermissionDenied(
                f"chunk {min(live)} is in use by a file; a live chunk is never written again"
            )
        return self.caps(request.chunks, request.op, ttl)

    def attach(self, request: Request[Any], result: Any, ttl: float = auth.GRANT_TTL_S) -> Any:
        """A reply with the capabilities its caller will need on the data nodes, each
        valid for ``ttl`` seconds (a tenant's: ``TENANT_TTL_S``)."""
        if isinstance(request, Prepare):
            placements: list[Placement] = result
            grants = iter(self.caps([p.chunk.id for p in placements if p.upload], "write", ttl))
            return [replace(p, grant=next(grants)) if p.upload else p for p in placements]
        if isinstance(result, FileLayout):
            ids = {x.chunk.id for x in result.extents} - result.inline.keys()
            caps = self.caps(ids | _pieces(result.stripes), "read", ttl)
            return replace(result, grants={c.chunk: c for c in caps})
        if isinstance(result, ChunkPage):
            ids = {chunk.id for chunk, _ in result.chunks}
            caps = self.caps(ids | _pieces(result.stripes), "read", ttl)
            return replace(result, grants={c.chunk: c for c in caps})
        return result


def _pieces(stripes: dict[str, Stripe]) -> set[str]:
    """The ids of every piece of these stripes."""
    return {p.id for stripe in stripes.values() for p in stripe.pieces}
