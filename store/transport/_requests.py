"""The metadata requests: what a client asks of the metadata service.

Each request names its response type and its ``Rule``: whether it only reads,
how a client may repeat it, and what a tenant's token needs to make it. Every
part that must know these derives them from the rule (the service's tenant
checks, the embedded store's reader threads, the client's retries); the code
that carries a request out is registered beside it in ``meta``
(``meta/_operations.py``). The values they carry and return are the public
ones of ``graben.store._types`` and the replies of ``_replies``.

Mutations (``Repeat.KEYED``) carry an idempotency key (``CommitEach``, one per
batch): a remote client gives each logical request one (``with_key``) and
keeps it across retries; the metadata service records the key with the
outcome in the transaction that applies the mutation, and answers a repeat
with the recorded outcome instead of applying it again. An embedded client
sends no key (it never repeats a request).
"""

from __future__ import annotations

import enum
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

import msgspec

from .._types import (
    Capability,
    Change,
    ChangeFeed,
    ChunkProblem,
    ChunkRef,
    FileCommit,
    FileInfo,
    FileLayout,
    Health,
    NodeState,
    Op,
)
from ._replies import (
    Changed,
    ChunkPage,
    Committed,
    Joined,
    Listing,
    Placement,
    Removed,
    Settings,
)

R = TypeVar("R")


class Repeat(enum.Enum):
    """How a client may send a request again when no reply came."""

    AS_IS = "as is"
    """A read, or a write whose repeat changes nothing: again until the client's timeout."""
    KEYED = "keyed"
    """A mutation: again with the same idempotency key, applied once, within
    ``RETRY_WITHIN_S`` of the first try (while the service still holds the key)."""


AS_IS, KEYED = Repeat.AS_IS, Repeat.KEYED
READS, WRITES = True, False
ANY = "any"
"""The right of a request any valid token may make."""
OPERATOR = "operator"
"""The right of a request only the cluster's secret may make, never a tenant's token."""


def _no_paths(request: Any) -> tuple[str, ...]:
    return ()


@dataclass(frozen=True, slots=True)
class Rule:
    """What every part of graben must know of a request kind, declared once with it."""

    reads: bool
    """Whether it only reads the namespace (an embedded store runs it beside the writer)."""
    repeat: Repeat
    """How a client may repeat it."""
    right: str
    """What a tenant's token needs to make it: ``r``, ``w`` or ``a`` on ``paths``,
    ``ANY`` or ``OPERATOR``."""
    paths: Callable[[Any], tuple[str, ...]] = _no_paths
    """The paths it names, each of which the token must reach."""
    not_the_prefix: str = ""
    """A field naming a path that may not be a tenant's prefix itself (the operator's
    to move, remove or give a quota)."""


class Request(msgspec.Struct, Generic[R], frozen=True, tag=True):
    """A metadata operation; ``response`` is the type it returns, ``rule`` how it is
    repeated, run and allowed."""

    response: ClassVar[Any]
    rule: ClassVar[Rule]

    def needs(self) -> tuple[str, tuple[str, ...]]:
        """The right a tenant's token needs to make this request, and the paths it must
        reach with it."""
        return self.rule.right, self.rule.paths(self)


class Stat(Request[FileInfo], frozen=True):
    """Attributes of one path."""

    response = FileInfo
    rule = Rule(READS, AS_IS, "r", lambda r: (r.path,))
    path: str


class ListDir(Request[Listing], frozen=True):
    """A page of a directory's entries (or the file itself), sorted by name.

    The first page names the path; later pages name the directory's inode and
    the last name seen, so a directory renamed meanwhile is still listed whole.
    """

    response = Listing
    rule = Rule(READS, AS_IS, "r", lambda r: (r.path,))
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
    rule = Rule(WRITES, KEYED, "w", lambda r: (r.path,))
    path: str
    parents: bool = False
    exist_ok: bool = False
    key: str = ""
    mode: int | None = None
    """Its permission bits; ``None``: 0o755."""
    uid: int = -1
    """Its owner (-1: none recorded)."""
    gid: int = -1
    """Its group (-1: none recorded)."""


class Link(Request[FileInfo], frozen=True):
    """Give a file another name (a hard link)."""

    response = FileInfo
    rule = Rule(WRITES, KEYED, "w", lambda r: (r.src, r.dst))
    src: str
    dst: str
    key: str = ""


class Remove(Request[int], frozen=True):
    """Remove a path; returns how many entries went."""

    response = int
    rule = Rule(WRITES, KEYED, "w", lambda r: (r.path,), not_the_prefix="path")
    path: str
    recursive: bool = False
    key: str = ""


class RemoveEach(Request[list[Removed]], frozen=True):
    """Remove several paths in one transaction, in their order, each on its own: a path
    that cannot go (gone already, a directory not empty) gets its error and the others
    go (a mount's unlinks, answered at once and removed in groups)."""

    response = list[Removed]
    rule = Rule(WRITES, KEYED, "w", lambda r: r.paths, not_the_prefix="paths")
    paths: tuple[str, ...]
    directories: tuple[bool, ...] = ()
    """For each path, whether it may be an (empty) directory (``False``: unlink's
    ``IsADirectory``); none given: each may."""
    key: str = ""


class Rename(Request[FileInfo], frozen=True):
    """Move a file or directory atomically."""

    response = FileInfo
    rule = Rule(
        WRITES,
        KEYED,
        "w",
        lambda r: (r.src, r.dst, *(f.path for f in r.files)),
        not_the_prefix="src",
    )
    src: str
    dst: str
    replace: bool = True
    replace_tree: bool = False
    """Replace a non-empty directory too, deleting its tree in the same transaction."""
    key: str = ""
    files: tuple[FileCommit, ...] = ()
    """Files committed first, in the same transaction (a checkpoint's last files and its
    publishing move at once)."""


class SetAttributes(Request[FileInfo], frozen=True):
    """Change a file's or directory's mode bits, times or owner in place."""

    response = FileInfo
    rule = Rule(WRITES, KEYED, "w", lambda r: (r.path,))
    path: str
    change: Change = msgspec.field(default_factory=Change)
    """What changes; what it leaves ``None`` stays."""
    key: str = ""


class SetAttributesEach(Request[list[Changed]], frozen=True):
    """``SetAttributes`` for several paths in one transaction, in their order, each on
    its own: a path that is gone gets its error and the others change (a mount's
    ``chmod``, ``touch`` and ``chown``, answered at once and sent in groups)."""

    response = list[Changed]
    rule = Rule(WRITES, KEYED, "w", lambda r: r.paths)
    paths: tuple[str, ...]
    changes: tuple[Change, ...]
    """One a path."""
    key: str = ""


class GetLayout(Request[FileLayout], frozen=True):
    """Where a file's bytes are: a page of its extents, from file offset ``start``.

    Later pages name the version's inode, so they describe the same version
    as the first; ``NotFound`` if it was replaced meanwhile.
    """

    response = FileLayout
    rule = Rule(READS, AS_IS, "r", lambda r: (r.path,))
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
    rule = Rule(READS, AS_IS, "w", lambda r: r.paths)
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
    rule = Rule(WRITES, KEYED, "w", lambda r: tuple(f.path for f in r.files))
    files: tuple[FileCommit, ...]
    key: str = ""


class Usage(Request[tuple[int, int]], frozen=True):
    """(files, bytes) under a path, recursively."""

    response = tuple[int, int]
    rule = Rule(READS, AS_IS, "r", lambda r: (r.path,))
    path: str


class ChunkRefs(Request[ChunkPage], frozen=True):
    """A page of the chunks the engine knows, ids after ``after``, for fsck."""

    response = ChunkPage
    rule = Rule(READS, AS_IS, OPERATOR)
    after: str = ""
    limit: int = 0
    """Most chunks in the page; 0 (and anything larger) is the server's page size."""


class ChunkUsers(Request[list[tuple[int, str]]], frozen=True):
    """A page of the files using a chunk: ``(inode, path)`` for inodes after ``after``,
    in inode order; ``path`` is ``""`` for an inode no entry names. Empty: no more."""

    response = list[tuple[int, str]]
    rule = Rule(READS, AS_IS, OPERATOR)
    chunk: str
    after: int = 0
    limit: int = 0


class Collectable(Request[list[tuple[str, tuple[str, ...], float]]], frozen=True):
    """Forget a page of chunks unreferenced for longer than ``grace_s``; returns their
    ids with the nodes that held them (their copies may go) and the cutoff (Unix
    seconds) to delete them under: a copy written since stays. Empty: none left."""

    response = list[tuple[str, tuple[str, ...], float]]
    rule = Rule(WRITES, KEYED, OPERATOR)
    grace_s: float
    limit: int = 0
    key: str = ""


class CheckMetadata(Request[list[ChunkProblem]], frozen=True):
    """Cross-check the engine's tables (entries, inodes, extents, chunks, refs);
    the first ``limit`` inconsistencies found (0: the server's page size)."""

    response = list[ChunkProblem]
    rule = Rule(READS, AS_IS, OPERATOR)
    limit: int = 0


class Changes(Request[ChangeFeed], frozen=True):
    """The change feed after ``after``: what a mount follows to keep its caches true."""

    response = ChangeFeed
    rule = Rule(READS, AS_IS, ANY)
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
    rule = Rule(READS, AS_IS, ANY)


class RestorePoint(Request[int], frozen=True):
    """When the backup this store's metadata was restored from was taken (ns since the
    epoch; 0: never restored): chunk files written since are no metadata's, as expected."""

    response = int
    rule = Rule(READS, AS_IS, OPERATOR)


class Heartbeat(Request[Joined], frozen=True):
    """A data node says it is alive; refused if it belongs to another store."""

    response = Joined
    rule = Rule(WRITES, AS_IS, OPERATOR)
    node: NodeState
    store_id: str = ""
    """The store the node belongs to; ``""`` if it has joined none yet."""
    sealed: str = "none"
    """The check value of the key the node encrypts chunk files with, or ``"none"``."""


class ListNodes(Request[list[NodeState]], frozen=True):
    """Every registered data node."""

    response = list[NodeState]
    rule = Rule(READS, AS_IS, ANY)


class ReportBad(Request[None], frozen=True):
    """A reader found a copy corrupt or missing: forget it so repair replaces it."""

    response = None
    rule = Rule(WRITES, AS_IS, "r")
    chunk: str
    node: str
    reason: str = ""


class GetHealth(Request[Health], frozen=True):
    """The store's health at a glance."""

    response = Health
    rule = Rule(READS, AS_IS, OPERATOR)


class GetSettings(Request[Settings], frozen=True):
    """What a writer needs to know of the service (asked once per client)."""

    response = Settings
    rule = Rule(READS, AS_IS, ANY)


class CommitEach(Request[list[Committed]], frozen=True):
    """Several independent ``Commit`` batches in one round trip; each all or nothing."""

    response = list[Committed]
    rule = Rule(WRITES, KEYED, "w", lambda r: tuple(f.path for b in r.batches for f in b))
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
    rule = Rule(READS, AS_IS, "r")
    chunks: tuple[str, ...]
    op: Op

    def needs(self) -> tuple[str, tuple[str, ...]]:
        """Reading a chunk needs ``r``, writing one ``w``; deleting is collection's, the
        operator's."""
        return {"read": "r", "write": "w"}.get(self.op, OPERATOR), ()


Q = TypeVar("Q", bound="Request[Any]")
KEY_LIFETIME_S = 600.0
"""How long the metadata service keeps a mutation's key and reply (``meta/_idempotency.py``)."""
RETRY_WITHIN_S = KEY_LIFETIME_S / 2
"""A client repeats a mutation only this long after first sending it, whatever its
timeout: a repeat after the key is gone would be applied again. Half the lifetime
leaves room for clocks that disagree and requests that wait in a queue."""


def new_key() -> str:
    """A fresh idempotency key: 16 random bytes in hex."""
    return secrets.token_hex(16)


def with_key(request: Q) -> Q:
    """``request`` with an idempotency key, if it is a mutation without one yet."""
    if request.rule.repeat is not KEYED:
        return request
    if isinstance(request, CommitEach):
        if len(request.keys) == len(request.batches):
            return request
        return msgspec.structs.replace(request, keys=tuple(new_key() for _ in request.batches))
    if not getattr(request, "key", ""):
        return msgspec.structs.replace(request, key=new_key())
    return request


def request_types() -> tuple[type[Request[Any]], ...]:
    """Every request type, for decoding whichever one arrives."""
    return tuple(Request.__subclasses__())
