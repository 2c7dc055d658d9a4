"""The transport seam: what reaching a store's two halves looks like.

Owns the metadata requests (``_requests``: each names its response type;
mutations carry idempotency keys), the two protocols every client feature
is written against (``_protocols``: ``MetaTransport`` for the metadata
service, ``ChunkTransport`` for the data nodes) and their implementations
over the wire (``_remote``: ``RemoteMeta``, ``RemoteChunks``, the
capabilities at hand, a connection pool; ``_endpoints``: the metadata
services a client may use, and which one it is using). The servers
use the remote transports too, to reach each other; the in-process
implementations are the ``embedded`` layer's.

May import: ``wire`` and the store's shared modules.
"""

from ._endpoints import Endpoints
from ._protocols import ChunkTransport, MetaTransport
from ._remote import Grants, Pool, RemoteChunks, RemoteMeta, open_cluster
from ._requests import (
    KEY_LIFETIME_S,
    KEYED,
    RETRY_WITHIN_S,
    CheckMetadata,
    ChunkRefs,
    ChunkUsers,
    Collectable,
    Commit,
    CommitEach,
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
    Stat,
    Usage,
    new_key,
    request_types,
    with_key,
)

__all__ = [
    "KEYED",
    "KEY_LIFETIME_S",
    "RETRY_WITHIN_S",
    "CheckMetadata",
    "ChunkRefs",
    "ChunkTransport",
    "ChunkUsers",
    "Collectable",
    "Commit",
    "CommitEach",
    "Endpoints",
    "GetHealth",
    "GetLayout",
    "GetSettings",
    "GetStoreId",
    "Grant",
    "Grants",
    "Heartbeat",
    "Link",
    "ListDir",
    "ListNodes",
    "MakeDir",
    "MetaTransport",
    "Pool",
    "Prepare",
    "RemoteChunks",
    "RemoteMeta",
    "Remove",
    "Rename",
    "ReportBad",
    "Request",
    "SetAttributes",
    "Stat",
    "Usage",
    "new_key",
    "open_cluster",
    "request_types",
    "with_key",
]
