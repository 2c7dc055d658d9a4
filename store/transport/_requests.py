"""The metadata requests: what a client asks of the metadata service.

Each request names its response type; the metadata logic (``meta``)
executes them, an embedded client hands them over in-process and a remote
one sends them over the wire (``_remote``). The values they carry and
return are the public ones of ``graben.store._types`` and the replies of
``_replies``.

Mutations (``KEYED``, and ``CommitEach`` per batch) carry an idempotency
key: a remote client gives each logical request one (``with_key``) and keeps
it across retries; the metadata service records the key with the outcome in
the transaction that applies the mutation, and answers a repeat with the
recorded outcome instead of applying it again. An embedded client sends no
key (it never repeats a request).
"""

from __future__ import annotations

import secrets
from typing import Any, ClassVar, Generic, TypeVar

import msgspec

from .._types import (
    Capability,
    Change,
    ChangeFeed,
    ChunkProblem,
    ChunkRef,
    ClassState,
    FileCommit,
    FileInfo,
    FileLayout,
    Health,
    NodeState,
    Op,
    QuotaState,
    TokenInfo,
)
from ._replies import ChunkPage, Committed, Issued, Joined, Listing, Placement, Settings

R = TypeVar("R")


class Request(msgspec.Struct, Generic[R], frozen=True, tag=True):
    """A metadata operation; ``response`` is the type it returns."""

    response: ClassVar[Any]


class Stat(Request[FileInfo], frozen=True):
    """Attributes of one path."""

    response = FileInfo
    path: str


class ListDir(Request[Listing], frozen=True):
    """A page of a directory's entries (or the file itself), sorted by name.

    The first page names the path; later pages name the directory's inode and
    the last name seen, so a directory renamed meanwhile is still listed whole.
    """

    response = Listing
    path: str
    after: str = ""
    """Only names after this one."""
    limit: int = 0
    """At most this many entries (0: the service's page size)."""
    directory: int = 0
    """Go on listing this directory inode (later pages)."""


class MakeDir(Request[FileInfo], frozen=True):
    """Create a directory."""

    response = FileInfo
    path: str
    parents: bool = False
    exist_ok: bool = False
    key: str = ""
    """The client's idempotency key: a retry with the same key is applied once (``""``: none)."""
    mode: int | None = None
    """Its permission bits; ``None``: 0o755."""
    uid: int = -1
    """Its owner (-1: none recorded)."""
    gid: int = -1
    """Its group (-1: none recorded)."""


class Link(Request[FileInfo], frozen=True):
    """Give a file another name (a hard link)."""

    response = FileInfo
    src: str
    dst: str
    key: str = ""
    """The client's idempotency key: a retry with the same key is applied once (``""``: none)."""


class Remove(Request[int], frozen=True):
    """Remove a path; returns how many entries went."""

    response = int
    path: str
    recursive: bool = False
    key: str = ""
    """The client's idempotency key: a retry with the same key is applied once (``""``: none)."""


class Rename(Request[FileInfo], frozen=True):
    """Move a file or directory atomically."""

    response = FileInfo
    src: str
    dst: str
    replace: bool = True
    replace_tree: bool = False
    """Replace a non-empty directory too, deleting its tree in the same transaction."""
    key: str = ""
    """The client's idempotency key: a retry with the same key is applied once (``""``: none)."""
    files: tuple[FileCommit, ...] = ()
    """Files committed first, in the same transaction (a checkpoint's last files and its
    publishing move at once)."""


class SetAttributes(Request[FileInfo], frozen=True):
    """Change a file's or directory's mode bits, times or owner in place."""

    response = FileInfo
    path: str
    change: Change = msgspec.field(default_factory=Change)
    """What changes; what it leaves ``None`` stays."""
    key: str = ""
    """The client's idempotency key: a retry with the same key is applied once (``""``: none)."""


class GetLayout(Request[FileLayout], frozen=True):
    """Where a file's bytes are: a page of its extents, from file offset ``start``.

    Later pages name the version's inode, so they describe the same version
    as the first; ``NotFound`` if it was replaced meanwhile.
    """

    response = FileLayout
    path: str
    start: int = 0
    """First file offset wanted (a page's extents start at or before it)."""
    limit: int = 0
    """At most this many extents (0: the service's page size)."""
    inode: int = 0
    """The version the first page described (later pages)."""


class Prepare(Request[list[Placement]], frozen=True):
    """Ask, for a batch of chunks, which to upload and where (0: the store's default)."""

    response = list[Placement]
    chunks: tuple[ChunkRef, ...]
    replication: int = 0
    avoid: tuple[str, ...] = ()
    min_replicas: int = 0
    """Fewest copies the write may go on with (0: the store's ``--min-replicas``)."""
    paths: tuple[str, ...] = ()
    """Each chunk's file (none: not checked against quotas until the commit)."""
    sent: tuple[int, ...] = ()
    """Each chunk's file's bytes before it: what the file takes of its quotas with it."""


class Commit(Request[list[FileInfo]], frozen=True):
    """Make a batch of files visible, each atomically."""

    response = list[FileInfo]
    files: tuple[FileCommit, ...]
    key: str = ""
    """The client's idempotency key: a retry with the same key is applied once (``""``: none)."""


class Usage(Request[tuple[int, int]], frozen=True):
    """(files, bytes) under a path, recursively."""

    response = tuple[int, int]
    path: str


class ChunkRefs(Request[ChunkPage], frozen=True):
    """A page of the chunks the engine knows, ids after ``after``, for fsck."""

    response = ChunkPage
    after: str = ""
    limit: int = 0
    """Most chunks in the page; 0 (and anything larger) is the server's page size."""


class ChunkUsers(Request[list[tuple[int, str]]], frozen=True):
    """A page of the files using a chunk: ``(inode, path)`` for inodes after ``after``,
    in inode order; ``path`` is ``""`` for an inode no entry names. Empty: no more."""

    response = list[tuple[int, str]]
    chunk: str
    after: int = 0
    limit: int = 0


class Collectable(Request[list[tuple[str, tuple[str, ...]]]], frozen=True):
    """Forget a page of chunks unreferenced for longer than ``grace_s``; returns their
    ids with the nodes that held them (their copies may go). Empty: none left."""

    response = list[tuple[str, tuple[str, ...]]]
    grace_s: float
    limit: int = 0
    key: str = ""
    """The client's idempotency key: a retry with the same key is applied once (``""``: none)."""


class CheckMetadata(Request[list[ChunkProblem]], frozen=True):
    """Cross-check the engine's tables (entries, inodes, extents, chunks, refs);
    the first ``limit`` inconsistencies found (0: the server's page size)."""

    response = list[ChunkProblem]
    limit: int = 0


class Changes(Request[ChangeFeed], frozen=True):
    """The change feed after ``after``: what a mount follows to keep its caches true."""

    response = ChangeFeed
    after: int = -1
    """The last number the reader has (-1: none; the reply only says where the feed is)."""
    missing: tuple[int, ...] = ()
    """Numbers before ``after`` the reader has not seen yet (a transaction that took its
    number earlier may commit later: PostgreSQL numbers rows as they are written)."""
    limit: int = 0
    """At most this many changes (0: the service's page size)."""


class GetStoreId(Request[str], frozen=True):
    """The store's id, made when its engine was created."""

    response = str


class Heartbeat(Request[Joined], frozen=True):
    """A data node says it is alive; refused if it belongs to another store."""

    response = Joined
    node: NodeState
    store_id: str = ""
    """The store the node belongs to; ``""`` if it has joined none yet."""
    sealed: str = "none"
    """The check value of the key the node encrypts chunk files with, or ``"none"``."""


class ListNodes(Request[list[NodeState]], frozen=True):
    """Every registered data node."""

    response = list[NodeState]


class ReportBad(Request[None], frozen=True):
    """A reader found a copy corrupt or missing: forget it so repair replaces it."""

    response = None
    chunk: str
    node: str
    reason: str = ""


class GetHealth(Request[Health], frozen=True):
    """The store's health at a glance."""

    response = Health


class GetSettings(Request[Settings], frozen=True):
    """What a writer needs to know of the service (asked once per client)."""

    response = Settings


class CommitEach(Request[list[Committed]], frozen=True):
    """Several independent ``Commit`` batches in one round trip; each all or nothing."""

    response = list[Committed]
    batches: tuple[tuple[FileCommit, ...], ...]
    keys: tuple[str, ...] = ()
    """Each batch's idempotency key (its ``Commit``'s), in order; none if empty."""


class Grant(Request[list[Capability]], frozen=True):
    """Fresh capabilities for ``op`` on each chunk (a cluster only).

    Reads are granted to any client with a valid token; writes only for
    chunks no live file uses (a live chunk never changes); deletes only for
    chunks the metadata no longer names (orphans), so a client's collection
    can never delete live data.
    """

    response = list[Capability]
    chunks: tuple[str, ...]
    op: Op


Q = TypeVar("Q", bound="Request[Any]")
KEY_LIFETIME_S = 600.0
"""How long the metadata service keeps a mutation's key and reply (``meta/_once.py``)."""
RETRY_WITHIN_S = KEY_LIFETIME_S / 2
"""A client repeats a mutation only this long after first sending it, whatever its
timeout: a repeat after the key is gone would be applied again. Half the lifetime
leaves room for clocks that disagree and requests that wait in a queue."""


class SetClass(Request[str], frozen=True):
    """Set the storage class of a path (``""``: clear it); the class's canonical name."""

    response = str
    path: str
    name: str
    key: str = ""


class GetClass(Request[ClassState], frozen=True):
    """The storage class in force at a path, and how far a file has taken it."""

    response = ClassState
    path: str


class AddTenant(Request[QuotaState], frozen=True):
    """Add a tenant with its root (made) and the root's quota (0: no limit of a kind)."""

    response = QuotaState
    name: str
    root: str
    max_bytes: int = 0
    max_physical: int = 0
    max_files: int = 0
    key: str = ""


class ListTenants(Request[dict[str, str]], frozen=True):
    """Every tenant's root, by name."""

    response = dict[str, str]


class IssueToken(Request[Issued], frozen=True):
    """A new token of a tenant, for a prefix within its root (``""``: the root)."""

    response = Issued
    tenant: str
    prefix: str
    rights: str
    ttl_s: float


class ListTokens(Request[list[TokenInfo]], frozen=True):
    """Every token (of ``tenant``), never its secret."""

    response = list[TokenInfo]
    tenant: str = ""


class WhoAmI(Request["TokenInfo | None"], frozen=True):
    """The token this request is signed with: a tenant's, as ``token ls`` shows it (what
    it reaches, its rights), or ``None`` for the cluster's own (everything)."""

    response = TokenInfo | None


class RevokeTokens(Request[int], frozen=True):
    """Revoke tokens by id, or every token of ``tenant``; how many were live."""

    response = int
    ids: tuple[str, ...] = ()
    tenant: str = ""


class SetQuota(Request[QuotaState], frozen=True):
    """Set a directory's quota (0: no limit of a kind; all 0: clear it)."""

    response = QuotaState
    path: str
    max_bytes: int = 0
    max_physical: int = 0
    max_files: int = 0
    key: str = ""


class GetQuotas(Request[list[QuotaState]], frozen=True):
    """The quotas above, at and below a path (``""``: every one)."""

    response = list[QuotaState]
    path: str = ""


KEYED: frozenset[type[Any]] = frozenset(
    {
        MakeDir,
        Link,
        Remove,
        Rename,
        SetAttributes,
        Commit,
        Collectable,
        SetClass,
        AddTenant,
        SetQuota,
    }
)
"""Mutations that carry one idempotency key (``CommitEach`` carries one per batch)."""


def new_key() -> str:
    """A fresh idempotency key: 16 random bytes in hex."""
    return secrets.token_hex(16)


def with_key(request: Q) -> Q:
    """``request`` with an idempotency key, if it is a mutation without one yet."""
    if type(request) in KEYED and not getattr(request, "key", ""):
        return msgspec.structs.replace(request, key=new_key())
    if isinstance(request, CommitEach) and len(request.keys) != len(request.batches):
        keys = tuple(new_key() for _ in request.batches)
        return msgspec.structs.replace(request, keys=keys)
    return request


def request_types() -> tuple[type[Request[Any]], ...]:
    """Every request type, for decoding whichever one arrives."""
    return tuple(Request.__subclasses__())
