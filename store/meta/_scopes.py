"""What a tenant's token may do: each request checked against its scope.

A metadata service resolves a call's token to a ``Scope`` (``TokenCache``):
``None`` for the cluster's own token (servers and operators: everything), or
the tenant, prefix and rights a tenant's token was issued with. The cache
reads the engine's tokens again once it is ``REFRESH_S`` old, so a token
revoked through any service is refused by every service within that time.

``authorize`` runs before a request is executed. Reads need ``r`` and a path
at or below the prefix; writes need ``w``, and may neither remove nor move
the prefix itself; classes and the quotas of directories strictly below the
prefix need ``a``. The directories above the prefix may be looked at (stat),
and listing one shows only the entry on the way to the prefix
(``narrow_listing``); the change feed shows only paths the scope reaches
(``narrow_feed``). A read capability for a chunk is granted only if a file
the scope reaches uses it; a tenant gets no delete capability, and none of
the operator's requests (tenants, tokens, nodes, fsck, collection).

Deduplication stays inside the scope: a tenant's ``Prepare`` sees as held only
the chunks its scope reaches (``mine``), and its commit may name a chunk only
with proof that its writer holds the bytes (``unproven``: inline bytes, or a
data node's receipt for every copy it claims; ``check_unproven``: else a file
the scope reaches uses the chunk), refused alike whoever else holds it.

Errors name the token's id, never its secret.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import msgspec

from .. import _paths
from .._errors import PermissionDenied
from .._types import ChangeFeed, NodeState, TokenInfo
from ..transport import (
    ANY,
    OPERATOR,
    Changes,
    Commit,
    CommitEach,
    GetLayout,
    GetQuotas,
    Grant,
    ListDir,
    Listing,
    ListNodes,
    ReportBad,
    Request,
    Stat,
    WhoAmI,
)
from ..wire import auth
from ._commits import Reached
from ._repo import Repository, TokenRow, Tx
from ._tenants import digest, parse_token
from ._walk import info, resolve

REFRESH_S = 0.5
"""How old a service's copy of the tokens may be: a revocation holds everywhere within it."""
UNKNOWN_MAX = 4096
"""Unknown ids remembered at most (a flood of made-up ones costs a lookup each, no more)."""
USER_PAGES = 16
"""Pages of a chunk's files looked through for one the scope reaches."""
USER_PAGE = 64
"""Files in each such page."""
_RIGHTS = {"r": "read", "w": "write", "a": "admin"}


class Scope(msgspec.Struct, frozen=True):
    """What one tenant's token reaches."""

    token: str
    """Its id."""
    tenant: str
    prefix: str
    rights: str
    info: TokenInfo | None = None
    """The token as ``token ls`` shows it (what ``WhoAmI`` answers)."""

    def reaches(self, path: str) -> bool:
        """Whether ``path`` is the prefix or below it."""
        return _paths.is_within(_paths.normalize(path), self.prefix)

    def leads_to(self, path: str) -> bool:
        """Whether ``path`` is a directory above the prefix (not the prefix itself)."""
        clean = _paths.normalize(path)
        return clean != self.prefix and _paths.is_within(self.prefix, clean)

    def need(self, right: str, *paths: str) -> None:
        """``PermissionDenied`` unless the token has ``right`` and reaches every path."""
        if right not in self.rights:
            raise PermissionDenied(
                f"token {self.token} has no {_RIGHTS[right]} right (it has {self.rights})",
                paths[0] if paths else None,
            )
        for path in paths:
            if not self.reaches(path):
                raise PermissionDenied(
                    f"token {self.token} reaches {self.prefix} only", _paths.normalize(path)
                )


def authorize(scope: Scope, request: Request[Any]) -> None:
    """``PermissionDenied`` unless ``scope`` may make ``request`` (what can be told
    without the engine; ``verify`` tells the rest on an engine thread): the right and
    the paths its ``Rule`` names."""
    if isinstance(request, Stat | ListDir) and scope.leads_to(request.path):
        return  # a directory above the prefix: its attributes, the entry on the way
    right, paths = request.needs()
    if right == ANY:
        return
    if right == OPERATOR:
        raise PermissionDenied(
            f"{type(request).__name__} is the operator's: it needs the cluster's secret, "
            f"not tenant {scope.tenant}'s token"
        )
    scope.need(right, *paths)
    field = request.rule.not_the_prefix
    named = getattr(request, field) if field else ()
    named = (named,) if isinstance(named, str) else named  # a path, or several
    if any(_paths.normalize(path) == scope.prefix for path in named):
        raise PermissionDenied(
            f"token {scope.token} may change what is below {scope.prefix}, not it",
            scope.prefix,
        )


def verify(repo: Repository, scope: Scope, request: Request[Any]) -> None:
    """On an engine thread: what ``authorize`` cannot tell from the request alone.

    An inode an earlier page pinned must be one the scope reaches; a chunk read
    capability or damage report needs a file the scope reaches to use the chunk.
    """
    pinned = request.directory if isinstance(request, ListDir) else 0
    pinned = request.inode if isinstance(request, GetLayout) else pinned
    if pinned:
        with repo.read() as tx:
            where = tx.tree.path_of(pinned)
        if where is None or not scope.reaches(where):
            raise PermissionDenied(f"token {scope.token} reaches {scope.prefix} only")
    chunks: Iterable[str] = ()
    if isinstance(request, Grant) and request.op == "read":
        chunks = request.chunks
    elif isinstance(request, ReportBad):
        chunks = (request.chunk,)
    for chunk in chunks:
        if not _uses(repo, scope, chunk):
            raise PermissionDenied(f"token {scope.token} reaches no file using chunk {chunk}")


def needs_engine(request: Request[Any]) -> bool:
    """Whether ``verify`` has anything to look up for ``request``."""
    return (
        (isinstance(request, ListDir) and bool(request.directory))
        or (isinstance(request, GetLayout) and bool(request.inode))
        or (isinstance(request, Grant) and request.op == "read")
        or isinstance(request, ReportBad)
    )


def narrow(scope: Scope, request: Request[Any], result: Any) -> Any:
    """``result`` as the scope may see it: the feed, paths the scope reaches; quotas,
    those the scope reaches and its tenant's own."""
    if isinstance(request, Changes):
        assert isinstance(result, ChangeFeed)
        kept = tuple(c for c in result.changes if scope.reaches(c.path))
        return msgspec.structs.replace(result, changes=kept)
    if isinstance(request, GetQuotas):
        return [q for q in result if scope.reaches(q.path) or q.tenant == scope.tenant]
    if isinstance(request, WhoAmI):  # the engine answered as for the cluster's own token
        return scope.info
    if isinstance(request, ListNodes):
        return hide_nodes(result)
    return result


def listing_above(repo: Repository, scope: Scope, path: str) -> Listing:
    """A directory above the prefix as the scope lists it: the entry on the way, if any."""
    parts = _paths.split(path)
    step = _paths.split(scope.prefix)[: len(parts) + 1]
    with repo.read() as tx:
        try:
            node = resolve(tx, step, _paths.join_parts(step))
        except FileNotFoundError:
            return Listing([])
    return Listing([info(_paths.join_parts(step), node)])


def _uses(repo: Repository, scope: Scope, chunk: str) -> bool:
    """Whether a file the scope reaches uses ``chunk`` (or the chunk it is a piece of)."""
    with repo.read() as tx:
        return bool(reached(tx, scope, [chunk]))


def reached(tx: Tx, scope: Scope, chunks: Sequence[str]) -> set[str]:
    """Which of ``chunks`` a file the scope reaches uses (a piece: its chunk's files).

    Looks through the first ``USER_PAGES`` pages of each chunk's files only: a chunk
    shared by more files than that may be missed, and its writer uploads it again.
    """
    whole = tx.stripes.striped(chunks)
    seen: dict[int, bool] = {}  # inode -> reached (a file's chunks share its path)
    found = set()
    for chunk in chunks:
        target, after = whole.get(chunk, chunk), 0
        for _ in range(USER_PAGES):
            page = tx.files.chunk_users(target, after, USER_PAGE)
            if not page:
                break
            if any(_reaches_inode(tx, scope, inode, seen) for inode in page):
                found.add(chunk)
                break
            after = page[-1]
    return found


def _reaches_inode(tx: Tx, scope: Scope, inode: int, seen: dict[int, bool]) -> bool:
    if inode not in seen:
        path = tx.tree.path_of(inode)
        seen[inode] = path is not None and scope.reaches(path)
    return seen[inode]


def mine(scope: Scope) -> Reached:
    """``Commits.prepare``'s view of held chunks for a tenant's writer: its own only."""
    return lambda tx, chunks: reached(tx, scope, chunks)


def unproven(secret: bytes, store: str, scope: Scope, request: Commit | CommitEach) -> set[str]:
    """The chunks a tenant's commit names without proof that its writer holds their bytes.

    Proof is the bytes themselves (kept inline, checked against the id by the
    commit) or a data node's receipt for every node the commit says holds a copy
    (``chunk.write`` answers one once the bytes hashed to the id). A copy claimed
    without a valid receipt is refused here. What is left must be a chunk a file
    the scope reaches uses already (``check_unproven``, on an engine thread).
    """
    files = (
        request.files if isinstance(request, Commit) else [f for b in request.batches for f in b]
    )
    now, proven = time.time(), set()
    for stored in (s for f in files for s in f.stored):
        if stored.data is not None:
            proven.add(stored.chunk.id)
            continue
        receipts = {r.node: r for r in stored.receipts}
        for node in stored.nodes:
            given = receipts.get(node)
            if given is None:
                raise PermissionDenied(
                    f"token {scope.token}: no receipt from node {node} for chunk "
                    f"{stored.chunk.id} (a tenant's commit shows one per copy)"
                )
            auth.check_receipt(secret, given, stored.chunk.id, node, now, store=store)
        if stored.nodes:
            proven.add(stored.chunk.id)
    return {x.chunk.id for f in files for x in f.extents} - proven


def check_unproven(repo: Repository, scope: Scope, chunks: set[str]) -> None:
    """On an engine thread: every chunk in ``chunks`` is used by a file the scope
    reaches. The refusal is the same whether or not anyone else holds the chunk."""
    with repo.read() as tx:
        missing = chunks - reached(tx, scope, sorted(chunks))
    if missing:
        raise PermissionDenied(
            f"token {scope.token}: the commit names chunk {min(missing)}, whose bytes it "
            "has not uploaded and no file it reaches uses"
        )


def hide_nodes(nodes: list[NodeState]) -> list[NodeState]:
    """The data nodes as a tenant sees them: where to reach them, not their disks."""
    return [msgspec.structs.replace(n, rack="", free=0, total=0) for n in nodes]


class TokenCache:
    """A service's copy of the tokens, read again once ``REFRESH_S`` old."""

    def __init__(
        self, secret: bytes, load: Callable[[list[str] | None], Awaitable[list[TokenRow]]]
    ) -> None:
        """``load``: the engine's tokens with these ids (every one: ``None``)."""
        self._secret, self._load = secret, load
        self._tokens: dict[str, TokenRow] = {}
        self._at = -1e9
        self._loading: asyncio.Future[None] | None = None
        self._unknown: dict[str, float] = {}
        """Ids looked for and not found lately: not looked for again within ``REFRESH_S``."""

    def _tenants(self, token: str) -> tuple[str, str] | None:
        """A tenant's token's (id, secret); ``None`` for the cluster's own token;
        ``PermissionDenied`` (saying what to set) for anything else."""
        if auth.is_client_token(self._secret, token):
            return None
        parsed = parse_token(token)
        if parsed is None:
            auth.check_token(self._secret, token)  # refuses it, saying what to set
        return parsed

    async def scope(self, token: str) -> Scope | None:
        """The scope of a call's token: ``None`` for the cluster's own; else its tenant's,
        or ``PermissionDenied`` (unknown, wrong, revoked or expired)."""
        parsed = self._tenants(token)
        if parsed is None:
            return None
        ident, secret = parsed
        if time.monotonic() - self._at > REFRESH_S:
            await self._refresh()
        if ident not in self._tokens:
            await self._look_for(ident)  # issued through another service since the refresh
        return _checked(self._tokens.get(ident), ident, secret)

    def admit(self, token: str) -> None:
        """Before a large request is read: the cluster's token, or a tenant's one not known
        to be bad (it is checked in full with the request)."""
        parsed = self._tenants(token)
        if parsed is not None and (row := self._tokens.get(parsed[0])) is not None:
            _checked(row, *parsed)

    async def _look_for(self, ident: str) -> None:
        now = time.monotonic()
        if now - self._unknown.get(ident, -1e9) < REFRESH_S:
            return
        if len(self._unknown) >= UNKNOWN_MAX:
            self._unknown.clear()
        for found, kept in await self._load([ident]):
            self._tokens[found.id] = (found, kept)
            return
        self._unknown[ident] = now

    async def _refresh(self) -> None:
        """Read every token again (one read at a time; the others wait for it)."""
        if self._loading is not None:
            await asyncio.shield(self._loading)
            return
        self._loading = asyncio.get_running_loop().create_future()
        try:
            rows = await self._load(None)
            self._tokens = {info.id: (info, kept) for info, kept in rows}
            self._at = time.monotonic()
        finally:
            self._loading.set_result(None)
            self._loading = None


def _checked(row: TokenRow | None, ident: str, secret: str) -> Scope:
    if row is None:
        raise PermissionDenied(f"token {ident} is not known to this cluster")
    info, kept = row
    if not hmac.compare_digest(digest(secret), kept):
        raise PermissionDenied(f"token {ident} is not known to this cluster")
    if info.revoked:
        raise PermissionDenied(f"token {ident} was revoked")
    if not time.time() < info.expires:
        raise PermissionDenied(f"token {ident} expired")
    return Scope(info.id, info.tenant, info.prefix, info.rights, info)
