"""The data node: chunk files on a local disk, served over the wire.

Owns the chunk store (``_chunkstore``: content-addressed chunk files, written
durably and atomically, read and checked; ``_sealed``: encrypted at rest with
the store's key, if it has one) and the data node's server
(``_server``: chunk reads and writes under capabilities, chain replication,
heartbeats, the scrubber). The embedded store uses the same chunk store
in-process.

May import: ``transport`` (a node forwards chunks to its peers), ``wire``
and the store's shared modules; never ``meta``, the ``client`` or anything
above it.
"""

from ._chunkstore import DIR_MODE, GROUP_SYNC_MAX, LocalChunkStore, disk_space, write_private
from ._identity import adoption, check_sealing, keep_store_id, read_id, seal_directory
from ._membership import bytes_under
from ._sealed import Sealer, load_key
from ._server import DataNode

__all__ = [
    "DIR_MODE",
    "GROUP_SYNC_MAX",
    "DataNode",
    "LocalChunkStore",
    "Sealer",
    "adoption",
    "bytes_under",
    "check_sealing",
    "disk_space",
    "keep_store_id",
    "load_key",
    "read_id",
    "seal_directory",
    "write_private",
]
