"""What the metadata service answers besides the public values: pages of a
listing or of the chunk layer and their sizes, where a new chunk goes, a
node's welcome, a writer's settings, one batch's outcome.

The requests that return them are in ``_requests``; what a user receives
(``FileInfo``, ``FileLayout``, ...) is in ``graben.store._types``.
"""

from __future__ import annotations

import msgspec

from .._types import Capability, ChunkRef, FileInfo, Stripe, TokenInfo
from ..wire import WireError

# Pages: no reply lists more than this, so no directory or file is too large.
LIST_PAGE = 1000
"""Directory entries in one ``ListDir`` reply unless fewer are asked for."""
LAYOUT_PAGE = 256
"""Extents in one ``GetLayout`` reply unless fewer are asked for (with replicas
and grants, ~100 KiB at three copies)."""
MAX_PAGE = 10_000
"""Most entries one reply carries, whatever is asked."""


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
    minimum: int = 1
    """Copies the write needs durable before it may go on (degraded) without the rest."""


class Issued(msgspec.Struct, frozen=True):
    """A new token: what ``token ls`` will show of it, and its text (in this reply only)."""

    info: TokenInfo
    token: str = msgspec.field(default="")


class Listing(msgspec.Struct, frozen=True):
    """One page of a directory's entries (see ``ListDir``)."""

    entries: list[FileInfo]
    """Entries sorted by name (a file lists as itself)."""
    directory: int = 0
    """Inode of the directory listed, for the next page (0 for a file)."""
    more: bool = False
    """Whether entries after the last one remain."""


class ChunkPage(msgspec.Struct, frozen=True):
    """One page of the chunk layer, in id order."""

    chunks: list[tuple[ChunkRef, tuple[str, ...]]]
    """Chunks with the nodes holding them."""
    after: str = ""
    """Where the next page starts (``ChunkRefs(after=...)``); ``""``: this was the last."""
    grants: dict[str, Capability] = msgspec.field(default_factory=dict)
    """Chunk id -> a cluster's permission to read it, for fsck (empty embedded)."""
    inline: dict[str, bytes] = msgspec.field(default_factory=dict)
    """Chunk id -> its bytes, for chunks the metadata engine keeps itself."""
    stripes: dict[str, Stripe] = msgspec.field(default_factory=dict)
    """Chunk id -> its pieces, for chunks kept erasure-coded (``grants`` open the pieces)."""


class Joined(msgspec.Struct, frozen=True):
    """The metadata service's answer to a heartbeat."""

    store_id: str
    """The store the node has joined: it keeps this id and refuses any other."""
    replication: int
    """The store's default copies per chunk."""
    sealed: str = ""
    """The store's encryption at rest: its key's check value, ``"none"``, or ``""`` (not
    recorded). A node whose own differs was not let in, and refuses to serve."""


class Settings(msgspec.Struct, frozen=True):
    """What a writer needs to know of the metadata service it writes through."""

    inline_max: int = 0
    """Largest file (bytes) the engine keeps inline, in its own rows; 0: none."""


class Removed(msgspec.Struct, frozen=True):
    """One path's outcome in a ``RemoveEach``: how many entries went, or why none did."""

    count: int = 0
    error: WireError | None = None


class Changed(msgspec.Struct, frozen=True):
    """One path's outcome in a ``SetAttributesEach``: its attributes now, or its error."""

    info: FileInfo | None = None
    error: WireError | None = None


class Committed(msgspec.Struct, frozen=True):
    """One batch's outcome in a ``CommitEach``: its files, or its error."""

    infos: list[FileInfo] = msgspec.field(default_factory=list)
    """What ``Commit`` would have returned."""
    error: WireError | None = None
    """Why the batch was not committed (then nothing of it was)."""
