"""Values shared by clients, the metadata logic and (later) the wire.

All are frozen msgspec Structs: slotted, hashable, and encodable as they are,
so servers and clients share one set of types.
"""

from __future__ import annotations

import mmap
from typing import Any, ClassVar, Final, Generic, Literal, TypeAlias, TypeVar, get_args

import msgspec

Buffer: TypeAlias = bytes | bytearray | memoryview | mmap.mmap
"""What the store accepts as bytes (anything with the buffer protocol works at run time)."""
Kind = Literal["file", "directory"]
WriteMode = Literal["overwrite", "create"]

LOCAL_NODE = "local"
"""The one node id of an embedded store."""

# Pages: no reply lists more than this, so no directory or file is too large.
LIST_PAGE = 1000
"""Directory entries in one ``ListDir`` reply unless fewer are asked for."""
LAYOUT_PAGE = 256
"""Extents in one ``GetLayout`` reply unless fewer are asked for (with replicas
and grants, ~100 KiB at three copies)."""
MAX_PAGE = 10_000
"""Most entries one reply carries, whatever is asked."""


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
    """Permission bits (with ``stat.S_IFLNK`` for a symbolic link made through a mount)."""

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
    """A signed, short-lived permission to do one op on one chunk (see ``_auth.py``)."""

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


class ChunkCall(msgspec.Struct, frozen=True):
    """The body of a data node's ``chunk.read`` and ``chunk.write``."""

    chunk: ChunkRef
    """The chunk to read or write."""
    cap: Capability
    """The metadata service's permission for this op on this chunk."""
    forward: tuple[str, ...] = ()
    """Chain replication: addresses of further replicas, each passing the chunk
    on to the next while it stores its own copy (writes only)."""


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


class Placement(msgspec.Struct, frozen=True):
    """The metadata service's answer for one chunk a writer is about to store."""

    chunk: ChunkRef
    """The chunk asked about."""
    upload: bool
    """False when the store holds the chunk already (dedup): send nothing."""
    nodes: tuple[str, ...]
    """Where to send it (or where it already is)."""
    grant: Capability | None = None
    """A cluster's permission to write it to those nodes (none embedded, or when not uploaded)."""


class StoredChunk(msgspec.Struct, frozen=True):
    """A chunk a writer uploaded, and the nodes that acknowledged it."""

    chunk: ChunkRef
    """The chunk."""
    nodes: tuple[str, ...]
    """Nodes holding a durable copy."""


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
    permissions: int = 0
    """Mode bits of the new version; 0 keeps those of the version it replaces (0o644 if none)."""


ProblemKind = Literal["missing", "corrupt", "orphan", "unreferenced", "metadata", "temporary"]
DAMAGE: Final[frozenset[str]] = frozenset({"missing", "corrupt", "metadata"})
"""Kinds of problem that mean data may be lost or wrong (orphans and temporaries are harmless)."""


class ChunkProblem(msgspec.Struct, frozen=True):
    """One finding of ``fsck``."""

    kind: ProblemKind
    """What is wrong: a copy ``missing`` or ``corrupt``, an ``orphan`` chunk file no
    metadata names, metadata that contradicts itself (``metadata``), a writer's
    leftover ``temporary`` file."""
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

    @property
    def ok(self) -> bool:
        """Whether nothing is missing, corrupt or inconsistent (orphans and temporaries
        are harmless)."""
        return not any(p.kind in DAMAGE for p in self.problems)


# --- metadata requests -----------------------------------------------------
# Each request names its response type; an engine executes them, an embedded
# client calls it in-process and a remote one sends them over the wire.

R = TypeVar("R")


class Request(msgspec.Struct, Generic[R], frozen=True, tag=True):
    """A metadata operation; ``response`` is the type it returns."""

    response: ClassVar[Any]


class Stat(Request[FileInfo], frozen=True):
    """Attributes of one path."""

    response = FileInfo
    path: str


class Listing(msgspec.Struct, frozen=True):
    """One page of a directory's entries (see ``ListDir``)."""

    entries: list[FileInfo]
    """Entries sorted by name (a file lists as itself)."""
    directory: int = 0
    """Inode of the directory listed, for the next page (0 for a file)."""
    more: bool = False
    """Whether entries after the last one remain."""


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


class Remove(Request[int], frozen=True):
    """Remove a path; returns how many entries went."""

    response = int
    path: str
    recursive: bool = False


class Rename(Request[FileInfo], frozen=True):
    """Move a file or directory atomically."""

    response = FileInfo
    src: str
    dst: str
    replace: bool = True
    replace_tree: bool = False
    """Replace a non-empty directory too, deleting its tree in the same transaction."""


class SetAttributes(Request[FileInfo], frozen=True):
    """Change a file's or directory's mode bits or modification time in place."""

    response = FileInfo
    path: str
    mode: int | None = None
    """New mode bits; ``None`` keeps them."""
    mtime_ns: int | None = None
    """New modification time; ``None`` keeps it."""


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


class Commit(Request[list[FileInfo]], frozen=True):
    """Make a batch of files visible, each atomically."""

    response = list[FileInfo]
    files: tuple[FileCommit, ...]


class Usage(Request[tuple[int, int]], frozen=True):
    """(files, bytes) under a path, recursively."""

    response = tuple[int, int]
    path: str


class ChunkPage(msgspec.Struct, frozen=True):
    """One page of the chunk layer, in id order."""

    chunks: list[tuple[ChunkRef, tuple[str, ...]]]
    """Chunks with the nodes holding them."""
    after: str = ""
    """Where the next page starts (``ChunkRefs(after=...)``); ``""``: this was the last."""
    grants: dict[str, Capability] = msgspec.field(default_factory=dict)
    """Chunk id -> a cluster's permission to read it, for fsck (empty embedded)."""


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


class CheckMetadata(Request[list[ChunkProblem]], frozen=True):
    """Cross-check the engine's tables (entries, inodes, extents, chunks, refs);
    the first ``limit`` inconsistencies found (0: the server's page size)."""

    response = list[ChunkProblem]
    limit: int = 0


class GetStoreId(Request[str], frozen=True):
    """The store's id, made when its engine was created."""

    response = str


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


class Joined(msgspec.Struct, frozen=True):
    """The metadata service's answer to a heartbeat."""

    store_id: str
    """The store the node has joined: it keeps this id and refuses any other."""
    replication: int
    """The store's default copies per chunk."""


class Heartbeat(Request[Joined], frozen=True):
    """A data node says it is alive; refused if it belongs to another store."""

    response = Joined
    node: NodeState
    store_id: str = ""
    """The store the node belongs to; ``""`` if it has joined none yet."""


class ListNodes(Request[list[NodeState]], frozen=True):
    """Every registered data node."""

    response = list[NodeState]


class ReportBad(Request[None], frozen=True):
    """A reader found a copy corrupt or missing: forget it so repair replaces it."""

    response = None
    chunk: str
    node: str
    reason: str = ""


class Degraded(msgspec.Struct, frozen=True):
    """A chunk with fewer live copies than its files ask for."""

    chunk: ChunkRef
    """The chunk."""
    live: tuple[str, ...]
    """Alive nodes holding a copy."""
    want: int
    """Copies its most demanding file asks for."""


class Health(msgspec.Struct, frozen=True):
    """What ``graben status`` shows."""

    nodes: list[NodeState]
    """Registered data nodes."""
    degraded: int
    """Referenced chunks with fewer live copies than their files ask for."""
    bad: int
    """Copies reported damaged and not yet deleted."""
    replication: int
    """The store's default copies per chunk."""
    store_id: str = ""
    """The store's id (every data node keeps it too)."""


class GetHealth(Request[Health], frozen=True):
    """The store's health at a glance."""

    response = Health


class NodeQuery(msgspec.Struct, frozen=True):
    """The body of a data node's ``chunk.inventory`` and ``chunk.temporaries``: one page."""

    store: str
    """The store the caller means; a node of another store refuses."""
    after: str = ""
    """File names after this one, in name order."""
    limit: int = 0
    """Most entries; 0 (and anything larger) is the node's page size."""


class NodeClean(msgspec.Struct, frozen=True):
    """The body of a data node's ``chunk.clean``: remove writers' leftover temporaries."""

    store: str
    """The store the caller means; a node of another store refuses."""
    older_than: float
    """Unix time: temporaries last written before it go."""


class WireError(msgspec.Struct, frozen=True):
    """A ``GrabenError`` as it crosses the wire (see ``_errors.ERRORS``)."""

    code: str
    message: str
    path: str | None = None


class Committed(msgspec.Struct, frozen=True):
    """One batch's outcome in a ``CommitEach``: its files, or its error."""

    infos: list[FileInfo] = msgspec.field(default_factory=list)
    """What ``Commit`` would have returned."""
    error: WireError | None = None
    """Why the batch was not committed (then nothing of it was)."""


class CommitEach(Request[list[Committed]], frozen=True):
    """Several independent ``Commit`` batches in one round trip; each all or nothing."""

    response = list[Committed]
    batches: tuple[tuple[FileCommit, ...], ...]


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


def request_types() -> tuple[type[Request[Any]], ...]:
    """Every request type, for decoding whichever one arrives."""
    return tuple(Request.__subclasses__())
