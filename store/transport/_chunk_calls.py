"""The bodies of a data node's calls, which ``RemoteChunks`` (``_remote``) sends
and the data node (``node/_server.py``) answers: ``ChunkCall`` for one chunk's
read, write or delete (a write answered with the nodes' ``Receipt``s, a
``chunk.write_many`` with one ``Written`` per chunk), ``NodeQuery`` for a page
of its inventory or of its temporaries, ``NodeClean`` to remove writers'
leftovers, ``NodeVouch`` to ask whether its chunk files predate its store id
(and to vouch for them).
"""

from __future__ import annotations

import msgspec

from .._types import Capability, ChunkRef, Receipt
from ..wire import WireError


class ChunkCall(msgspec.Struct, frozen=True):
    """The body of a data node's ``chunk.read`` and ``chunk.write``."""

    chunk: ChunkRef
    """The chunk to read or write."""
    cap: Capability
    """The metadata service's permission for this op on this chunk."""
    forward: tuple[str, ...] = ()
    """Chain replication: addresses of further replicas, each passing the chunk
    on to the next while it stores its own copy (writes only)."""


class Written(msgspec.Struct, frozen=True):
    """One chunk's outcome in a ``chunk.write_many`` reply."""

    error: WireError | None = None
    """Why it was not stored; ``None`` if it was."""
    receipt: Receipt | None = None
    """The node's receipt for it, if stored."""


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


class NodeVouch(msgspec.Struct, frozen=True):
    """The body of a data node's ``chunk.adoption``: whether its chunk files were there
    before it took its store id (collection must not delete them on the metadata's word)."""

    store: str
    """The store the caller means; a node of another store refuses."""
    vouch: bool = False
    """The caller vouches they are the store's (``fsck --collect --force``): drop the mark."""
