"""The store's public values: what ``graben.store`` exports and what its client
API returns, with the values inside them.

``FileInfo`` and ``Change``; the change feed's ``ChangeFeed`` of ``PathChange``
rows (``AsyncClient.changes``); ``FsckReport`` and its ``ChunkProblem`` findings;
``Health`` with its ``NodeState`` and ``ServiceState`` rows; ``FileLayout``
(``Client.layout``) with its ``Extent``, ``ChunkRef`` and ``Capability``
values; the ``FileCommit`` an ``Upload`` finishes as, with its
``StoredChunk`` values. Every layer uses them. What the layers only pass
among themselves lives where they do: the metadata service's other replies
and a data node's calls in ``transport``, the wire's error in ``wire``, the
repository's records in ``meta``.

All are frozen msgspec Structs: slotted, hashable, and encodable as they are,
so servers and clients share one set of types.
"""

from __future__ import annotations

import mmap
from typing import Final, Literal, Protocol, TypeAlias, TypedDict, get_args

import msgspec

Buffer: TypeAlias = bytes | bytearray | memoryview | mmap.mmap
"""What the store accepts as bytes (anything with the buffer protocol works at run time)."""
Kind = Literal["file", "directory"]
WriteMode = Literal["overwrite", "create"]


class FileInfo(msgspec.Struct, frozen=True):
    """What ``stat`` says of a file or directory."""

    path: str
    """Normalised absolute path, ``/a/b``."""
    kind: Kind
    """``"file"`` or ``"directory"``."""
    size: int
    """Bytes in the file; 0 for a directory."""
    mtime_ns: int
    """Last commit (files) or creation (directories), ns since the epoch."""
    inode: int
    """Stable id of this version of the file or of the directory."""
    generation: int = 1
    """Bumped each time a new version is committed at this path."""
    replication: int = 1
    """Copies kept of each chunk of the file."""
    mode: int = 0o644
    """Permission bits (with the type bits, ``stat.S_IFLNK`` and the like, of a symbolic
    link, fifo, socket or device node made through a mount)."""
    uid: int = -1
    """Owner's user id; -1 where none was recorded (a mount shows its own user)."""
    gid: int = -1
    """Owner's group id; -1 where none was recorded."""
    ctime_ns: int = 0
    """When its attributes or names last changed, ns since the epoch."""
    atime_ns: int = 0
    """Access time, ns since the epoch: set explicitly (reads leave it, as ``noatime``)."""
    nlink: int = 1
    """Names of a file (hard links); for a directory, 2 plus its subdirectories."""
    rdev: int = 0
    """Device number of a device node."""

    @property
    def name(self) -> str:
        """The last component of the path (``""`` for the root)."""
        return self.path.rpartition("/")[2]

    @property
    def is_dir(self) -> bool:
        """Whether this is a directory."""
        return self.kind == "directory"

    @property
    def is_file(self) -> bool:
        """Whether this is a regular file."""
        return self.kind == "file"


class Change(msgspec.Struct, frozen=True):
    """What ``set_attributes`` changes; each ``None`` keeps what the file has."""

    mode: int | None = None
    """Permission bits (0 to 0o7777)."""
    mtime_ns: int | None = None
    """Modification time, ns since the epoch."""
    atime_ns: int | None = None
    """Access time, ns since the epoch."""
    uid: int | None = None
    """Owner's user id (-1: none recorded)."""
    gid: int | None = None
    """Owner's group id (-1: none recorded)."""

    def applied(self, was: Attributed, now_ns: int) -> Applied:
        """The attributes of ``was`` that this change sets at ``now_ns``, as the store sets
        them (its type bits stay; the ctime moves to now): ``replace(was, **these)``."""
        return Applied(
            mode=was.mode if self.mode is None else was.mode & ~0o7777 | self.mode,
            mtime_ns=was.mtime_ns if self.mtime_ns is None else self.mtime_ns,
            atime_ns=was.atime_ns if self.atime_ns is None else self.atime_ns,
            uid=was.uid if self.uid is None else self.uid,
            gid=was.gid if self.gid is None else self.gid,
            ctime_ns=max(was.ctime_ns, now_ns),
        )


class Applied(TypedDict):
    """The attributes a ``Change`` sets (``Change.applied``)."""

    mode: int
    mtime_ns: int
    atime_ns: int
    uid: int
    gid: int
    ctime_ns: int


class Attributed(Protocol):
    """What ``Change.applied`` reads: a file's attributes (``FileInfo``, an engine's inode)."""

    @property
    def mode(self) -> int: ...
    @property
    def mtime_ns(self) -> int: ...
    @property
    def atime_ns(self) -> int: ...
    @property
    def uid(self) -> int: ...
    @property
    def gid(self) -> int: ...
    @property
    def ctime_ns(self) -> int: ...


class ChunkRef(msgspec.Struct, frozen=True):
    """The chunk layer's record of one immutable chunk."""

    id: str
    """The blake3 hash of the chunk's bytes, hex: the chunk is content-addressed."""
    length: int
    """Bytes in the chunk."""
    crc32c: int
    """crc32c of the chunk's bytes, checked on every write and read."""


Op = Literal["read", "write", "delete"]
"""What a capability allows on its chunk."""
OPS: Final[tuple[Op, ...]] = get_args(Op)
"""Every op, in the order of ``Op``."""


class Capability(msgspec.Struct, frozen=True):
    """A signed, short-lived permission to do one op on one chunk (see ``wire/_auth.py``)."""

    chunk: str
    """Id of the chunk it opens."""
    op: Op
    """The one operation it allows."""
    expires: float
    """Unix seconds; valid strictly before this instant."""
    mac: str
    """Hex HMAC-SHA256 over (chunk, op, expires, store) under the cluster secret."""
    store: str = ""
    """Id of the store whose metadata service granted it; a data node of another
    store refuses it (``""``: minted for no store in particular)."""


class Receipt(msgspec.Struct, frozen=True):
    """A data node's signed word that it received and stored a chunk's bytes (after
    checking their blake3): a writer's proof that it holds those bytes."""

    chunk: str
    """Id of the chunk stored."""
    node: str
    """Id of the node that stored it."""
    expires: float
    """Unix seconds; a commit must present it before this instant."""
    mac: str
    """Hex HMAC-SHA256 over (chunk, node, expires, store) under the cluster secret."""
    store: str = ""
    """Id of the node's store."""


class Extent(msgspec.Struct, frozen=True):
    """A run of a file's bytes stored in one chunk."""

    offset: int
    """Where the run starts in the file."""
    length: int
    """Bytes in the run."""
    chunk: ChunkRef
    """The chunk holding them."""
    chunk_offset: int = 0
    """Where the run starts in the chunk."""


class StoredChunk(msgspec.Struct, frozen=True):
    """A chunk a writer uploaded, and the nodes that acknowledged it."""

    chunk: ChunkRef
    """The chunk."""
    nodes: tuple[str, ...]
    """Nodes holding a durable copy (none when ``data`` is given)."""
    data: bytes | None = None
    """The chunk's bytes, for the metadata engine to keep itself instead of any node
    (a small file: no placement, no node write; ``Settings.inline_max`` bytes at most)."""
    receipts: tuple[Receipt, ...] = ()
    """The nodes' receipts for their copies (a tenant's commit must show one per node)."""


class Stripe(msgspec.Struct, frozen=True):
    """A chunk kept erasure-coded: K data and M parity pieces, each a chunk on one node."""

    k: int
    """Data pieces: the chunk's bytes, cut in K (the last padded with zeros)."""
    m: int
    """Parity pieces: how many pieces may be lost with the chunk still whole."""
    pieces: tuple[ChunkRef, ...]
    """The K + M pieces in order, data first; each stored like a chunk of its own."""
    nodes: tuple[str, ...]
    """The node holding each piece, ``""`` where none does (awaiting repair)."""


class ClassState(msgspec.Struct, frozen=True):
    """A path's storage class, and how far a file's chunks have taken it."""

    name: str
    """The class in force: the path's own, else its nearest directory's; ``""``: none
    (chunks stay as written, replicated)."""
    set_on: str
    """The path the class was set on; ``""``: none."""
    chunks: int = 0
    """Distinct chunks the file keeps on data nodes (0 for a directory; a small file's
    bytes kept in the metadata engine take no class)."""
    converted: int = 0
    """Of those, the chunks kept as a class says (erasure-coded, or in the S3 tier)."""


class TokenInfo(msgspec.Struct, frozen=True):
    """A tenant's token as ``graben token ls`` shows it: never its secret."""

    id: str
    """Its public id (the part of the token before its secret), for ``revoke``."""
    tenant: str
    prefix: str
    """The path it reaches: this directory and everything below it."""
    rights: str
    """``r`` read, ``w`` write, ``a`` admin (classes and quotas below its prefix)."""
    expires: float
    """Unix seconds after which it is refused."""
    made: float
    revoked: bool = False


class QuotaState(msgspec.Struct, frozen=True):
    """A directory's quota (a tenant's is its root's) and what its tree holds now."""

    path: str
    tenant: str
    """The tenant whose root this is; ``""``: a directory's own quota."""
    max_bytes: int
    """Logical bytes at most (0: no limit)."""
    max_physical: int
    """Bytes on disk at most, every copy counted (0: no limit)."""
    max_files: int
    """Files at most (0: no limit)."""
    bytes: int
    physical: int
    files: int


class FileLayout(msgspec.Struct, frozen=True):
    """Everything a reader needs: attributes, extents in order, replicas."""

    info: FileInfo
    """The file's attributes."""
    extents: tuple[Extent, ...]
    """Extents in file order, contiguous from 0 to ``info.size``."""
    replicas: dict[str, tuple[str, ...]]
    """Chunk id -> nodes holding it."""
    grants: dict[str, Capability] = msgspec.field(default_factory=dict)
    """Chunk id -> a cluster's permission to read it (empty for an embedded store)."""
    more: bool = False
    """Whether extents after these remain (a page of a ``GetLayout``)."""
    inline: dict[str, bytes] = msgspec.field(default_factory=dict)
    """Chunk id -> its bytes, for chunks the metadata engine keeps itself (small files)."""
    stripes: dict[str, Stripe] = msgspec.field(default_factory=dict)
    """Chunk id -> its pieces, for chunks kept erasure-coded (``grants`` open the pieces)."""


class FileCommit(msgspec.Struct, frozen=True):
    """One file a writer asks to make visible."""

    path: str
    """Where the file appears."""
    extents: tuple[Extent, ...]
    """Its bytes, in order."""
    stored: tuple[StoredChunk, ...] = ()
    """Chunks uploaded for it that the store did not hold before."""
    mode: WriteMode = "overwrite"
    """``"create"`` fails if the path exists at commit time."""
    replication: int = 0
    """Copies to keep of each chunk; 0 for the store's default."""
    permissions: int | None = None
    """Mode bits of the new version (with type bits for a symbolic link, fifo, socket or
    device node); ``None`` keeps those of the version it replaces (0o644 if none)."""
    uid: int | None = None
    """Owner of the new version; ``None`` keeps the replaced version's (none if new)."""
    gid: int | None = None
    """Group of the new version; ``None`` keeps the replaced version's."""
    mtime_ns: int | None = None
    """Its modification time; ``None``: the commit's time."""
    rdev: int = 0
    """Device number, for a device node."""


ProblemKind = Literal[
    "missing", "corrupt", "orphan", "unreferenced", "metadata", "temporary", "unreachable"
]
DAMAGE: Final[frozenset[str]] = frozenset({"missing", "corrupt", "metadata", "unreachable"})
"""Kinds of problem that mean data may be lost or wrong, or could not be checked (a node
``unreachable``); orphans and temporaries are harmless."""


class ChunkProblem(msgspec.Struct, frozen=True):
    """One finding of ``fsck``."""

    kind: ProblemKind
    """What is wrong: a copy ``missing`` or ``corrupt``, an ``orphan`` chunk file no
    metadata names, metadata that contradicts itself (``metadata``), a writer's
    leftover ``temporary`` file, a data node ``unreachable`` (dead or not answering:
    its copies were not checked)."""
    chunk: str
    """The chunk id (or file name, for orphans and temporaries; may be empty for metadata)."""
    where: str
    """Node and location of the copy (the engine's table, for metadata)."""
    paths: tuple[str, ...] = ()
    """Store paths whose files use the chunk."""
    detail: str = ""
    """A sentence for humans."""


class FsckReport(msgspec.Struct, frozen=True):
    """The result of checking every chunk."""

    chunks: int
    """Chunks checked."""
    bytes: int
    """Bytes re-read."""
    problems: tuple[ChunkProblem, ...]
    """Everything found wrong."""
    collected: int = 0
    """Chunk copies and temporaries deleted (with ``collect=True``)."""
    collection: Collection | None = None
    """What waits to be collected and what was freed, after the run (``None``: not told)."""

    @property
    def ok(self) -> bool:
        """Whether nothing is missing, corrupt or inconsistent (orphans and temporaries
        are harmless)."""
        return not any(p.kind in DAMAGE for p in self.problems)


class NodeState(msgspec.Struct, frozen=True):
    """A data node as the metadata service knows it."""

    id: str
    """Stable id, kept in the node's data directory."""
    address: str
    """``host:port`` of its chunk server."""
    rack: str
    """Failure domain label."""
    free: int
    """Free bytes on its disk."""
    total: int
    """Total bytes on its disk."""
    last_seen: float = 0.0
    """Unix time of its last heartbeat."""
    alive: bool = True
    """Heard from within the heartbeat timeout."""
    stored: int = 0
    """Bytes graben's files take on its disk (chunk files and temporaries, as ``du``
    counts them), apart from what else fills the disk."""
    scrubbed: float = 0.0
    """Unix time its last full scrub pass ended; 0: none since it started."""
    state: str = ""
    """``""`` in service; ``"draining"`` while its copies move off (nothing new is placed
    on it); ``"drained"`` once it holds nothing (``Health`` says so; it may be removed)."""
    held: int = 0
    """Chunk copies and pieces it holds, as ``Health`` counts them (0 elsewhere)."""
    metrics: str = ""
    """``host:port`` of its Prometheus ``/metrics``; ``""``: it serves none."""


class ServiceState(msgspec.Struct, frozen=True):
    """A metadata service as the engine knows it (each records itself there)."""

    id: str
    """Made when the service starts: a restarted service is a new one."""
    address: str
    """``host:port`` it advertises to clients."""
    engine: str
    """``sqlite`` or ``postgresql``."""
    started: float
    """Unix time it started, by the engine's clock."""
    last_seen: float
    """Unix time of its last heartbeat, by the engine's clock."""
    schema_version: int = 0
    """The schema version its code was written for (0: a service from before 17)."""
    alive: bool = True
    """Heard from within the last few seconds."""
    metrics: str = ""
    """``host:port`` of its Prometheus ``/metrics``; ``""``: it serves none."""


class Collection(msgspec.Struct, frozen=True):
    """Chunks no file uses any more: what waits to be collected, and what was freed."""

    waiting: int = 0
    """Chunks no file uses, not yet collected (within their grace, or awaiting a round)."""
    waiting_bytes: int = 0
    """Their bytes on the data nodes, every copy and piece counted."""
    freed: int = 0
    """Chunks collection has forgotten since the store was made (by the leader, or by
    ``fsck --collect``)."""
    freed_bytes: int = 0
    """Their bytes on the data nodes when they went."""
    grace_s: float | None = None
    """How long a chunk stays unused before the leader collects it; ``None``: nothing
    collects by itself (an embedded store: ``fsck --collect`` does)."""


class Health(msgspec.Struct, frozen=True):
    """What ``graben status`` shows."""

    nodes: list[NodeState]
    """Registered data nodes."""
    degraded: int
    """Referenced chunks with fewer live copies than their files ask for, or with a piece
    (erasure-coded) on no live node."""
    bad: int
    """Copies reported damaged and not yet deleted."""
    replication: int
    """The store's default copies per chunk."""
    store_id: str = ""
    """The store's id (every data node keeps it too)."""
    services: list[ServiceState] = msgspec.field(default_factory=list)
    """Metadata services sharing the engine (none for an embedded store)."""
    leader: str = ""
    """The id of the service whose lease runs the background duties; ``""``: none now."""
    fence: int = 0
    """The lease's fencing number: it grows each time another service takes the lease."""
    engine: str = ""
    """The engine: ``sqlite:///path`` or ``postgresql://user@host:port/db`` (no password)."""
    collection: Collection = msgspec.field(default_factory=Collection)
    """What waits to be collected and what collection has freed."""


class PathChange(msgspec.Struct, frozen=True, array_like=True):
    """One path a write changed, in the change feed (``meta/_changes.py``)."""

    seq: int
    """Its number: the feed's order."""
    path: str
    inode: int
    """The store inode at the path after the change (0: no name there now)."""
    ctime_ns: int
    """That inode's change time after it (0 with no inode)."""


class ChangeFeed(msgspec.Struct, frozen=True):
    """A page of the change feed (``Changes``)."""

    changes: tuple[PathChange, ...]
    """Changes numbered after the one asked for, and the missing ones asked for, by number."""
    newest: int
    """The feed's last number when asked (0: none yet)."""
    oldest: int
    """Its first number still kept: a reader behind it has missed changes."""
