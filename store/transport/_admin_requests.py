"""The operator's and the administrators' requests: classes, tenants, tokens, quotas.

Requests like those of ``_requests.py`` (same ``Request`` base, same rules),
kept apart so each module stays small: what a tenant with ``a`` may change, and
what only the cluster's secret may.
"""

from __future__ import annotations

from .._types import ClassState, NodeState, QuotaState, TokenInfo
from ._replies import Issued
from ._requests import ANY, AS_IS, KEYED, OPERATOR, READS, WRITES, Request, Rule


class SetClass(Request[str], frozen=True):
    """Set the storage class of a path (``""``: clear it); the class's canonical name."""

    response = str
    rule = Rule(WRITES, KEYED, "a", lambda r: (r.path,))
    path: str
    name: str
    key: str = ""


class GetClass(Request[ClassState], frozen=True):
    """The storage class in force at a path, and how far a file has taken it."""

    response = ClassState
    rule = Rule(READS, AS_IS, "r", lambda r: (r.path,))
    path: str


class AddTenant(Request[QuotaState], frozen=True):
    """Add a tenant with its root (made) and the root's quota (0: no limit of a kind)."""

    response = QuotaState
    rule = Rule(WRITES, KEYED, OPERATOR)
    name: str
    root: str
    max_bytes: int = 0
    max_physical: int = 0
    max_files: int = 0
    key: str = ""


class ListTenants(Request[dict[str, str]], frozen=True):
    """Every tenant's root, by name."""

    response = dict[str, str]
    rule = Rule(READS, AS_IS, OPERATOR)


class IssueToken(Request[Issued], frozen=True):
    """A new token of a tenant, for a prefix within its root (``""``: the root)."""

    response = Issued
    rule = Rule(WRITES, AS_IS, OPERATOR)
    tenant: str
    prefix: str
    rights: str
    ttl_s: float


class ListTokens(Request[list[TokenInfo]], frozen=True):
    """Every token (of ``tenant``), never its secret."""

    response = list[TokenInfo]
    rule = Rule(READS, AS_IS, OPERATOR)
    tenant: str = ""


class WhoAmI(Request["TokenInfo | None"], frozen=True):
    """The token this request is signed with: a tenant's, as ``token ls`` shows it (what
    it reaches, its rights), or ``None`` for the cluster's own (everything)."""

    response = TokenInfo | None
    rule = Rule(READS, AS_IS, ANY)


class RevokeTokens(Request[int], frozen=True):
    """Revoke tokens by id, or every token of ``tenant``; how many were live."""

    response = int
    rule = Rule(WRITES, AS_IS, OPERATOR)
    ids: tuple[str, ...] = ()
    tenant: str = ""


class SetQuota(Request[QuotaState], frozen=True):
    """Set a directory's quota (0: no limit of a kind; all 0: clear it)."""

    response = QuotaState
    rule = Rule(WRITES, KEYED, "a", lambda r: (r.path,), not_the_prefix="path")
    path: str
    max_bytes: int = 0
    max_physical: int = 0
    max_files: int = 0
    key: str = ""


class GetQuotas(Request[list[QuotaState]], frozen=True):
    """The quotas above, at and below a path (``""``: every one)."""

    response = list[QuotaState]
    rule = Rule(READS, AS_IS, "r", lambda r: (r.path,) if r.path else ())
    path: str = ""


class DrainNode(Request[NodeState], frozen=True):
    """Move every copy and piece off a data node (``undo``: put it back in service); the
    node as it now stands. Nothing new is placed on a draining node."""

    response = NodeState
    rule = Rule(WRITES, AS_IS, OPERATOR)
    node: str
    undo: bool = False


class RemoveNode(Request[None], frozen=True):
    """Unregister a stopped data node and forget its copies; refused while it is alive or
    holds the only copy of anything."""

    response = None
    rule = Rule(WRITES, AS_IS, OPERATOR)
    node: str
