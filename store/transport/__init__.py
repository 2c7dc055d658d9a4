"""The transport seam: what reaching a store's two halves looks like.

Owns the metadata requests (``_requests``: each names its response type;
mutations carry idempotency keys), the replies that are not public values
(``_replies``: pages, placements, a node's welcome), the bodies of a data
node's calls (``_chunk_calls``) and of a memory agent's (``_agent_calls``),
the two protocols every client feature is written against (``_protocols``:
``MetaTransport`` for the metadata service, ``ChunkTransport`` for the data
nodes) and their implementations over the wire (``_remote``: ``RemoteMeta``,
``RemoteChunks``, the capabilities at hand, a connection pool;
``_endpoints``: the metadata services a client may use, and which one it is
using). The servers use the remote transports too, to reach each other; the
in-process implementations are the ``embedded`` layer's.

May import: ``wire`` and the store's shared modules.
"""

from .._types import ChangeFeed, PathChange
from ._agent_calls import Held, JobRank, Piece, Reserve, SegmentKey, Status, Stored
from ._chunk_calls import ChunkCall, NodeClean, NodeQuery, NodeVouch
from ._endpoints import Endpoints
from ._protocols import ChunkTransport, MetaTransport
from ._remote import Grants, Pool, RemoteChunks, RemoteMeta, open_cluster
from ._replies import (
    LAYOUT_PAGE,
    LIST_PAGE,
    MAX_PAGE,
    ChunkPage,
    Committed,
    Joined,
    Listing,
    Placement,
    Settings,
)
from ._requests import (
    KEY_LIFETIME_S,
    KEYED,
    RETRY_WITHIN_S,
    Changes,
    CheckMetadata,
    ChunkRefs,
    ChunkUsers,
    Collectable,
    Commit,
    CommitEach,
    GetClass,
    GetHealth,
    GetLayout,
    GetSettings,
    GetStoreId,
    Grant,
    Heartbeat,
    Link,
    ListDir,
    ListNodes,
    MakeDir,
    Prepare,
    Remove,
    Rename,
    ReportBad,
    Request,
    SetAttributes,
    SetClass,
    Stat,
    Usage,
    new_key,
    request_types,
    with_key,
)

__all__ = [
    "KEYED",
    "KEY_LIFETIME_S",
    "LAYOUT_PAGE",
    "LIST_PAGE",
    "MAX_PAGE",
    "RETRY_WITHIN_S",
    "ChangeFeed",
    "Changes",
    "CheckMetadata",
    "ChunkCall",
    "ChunkPage",
    "ChunkRefs",
    "ChunkTransport",
    "ChunkUsers",
    "Collectable",
    "Commit",
    "CommitEach",
    "Committed",
    "Endpoints",
    "GetClass",
    "GetHealth",
    "GetLayout",
    "GetSettings",
    "GetStoreId",
    "Grant",
    "Grants",
    "Heartbeat",
    "Held",
    "JobRank",
    "Joined",
    "Link",
    "ListDir",
    "ListNodes",
    "Listing",
    "MakeDir",
    "MetaTransport",
    "NodeClean",
    "NodeQuery",
    "NodeVouch",
    "PathChange",
    "Piece",
    "Placement",
    "Pool",
    "Prepare",
    "RemoteChunks",
    "RemoteMeta",
    "Remove",
    "Rename",
    "ReportBad",
    "Request",
    "Reserve",
    "SegmentKey",
    "SetAttributes",
    "SetClass",
    "Settings",
    "Stat",
    "Status",
    "Stored",
    "Usage",
    "new_key",
    "open_cluster",
    "request_types",
    "with_key",
]
