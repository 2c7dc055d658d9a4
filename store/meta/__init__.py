"""The metadata service: names, files and chunks, kept in one engine.

Owns the namespace logic (``_namespace``: every metadata request, each
mutation one transaction; ``_bookkeeping``: the chunk and node records that
fsck, collection and repair read; ``_once``: mutations applied once per
idempotency key), the repository interface an engine
implements (``_repo``), the placement of new chunks on nodes (``_placement``:
a pure function), the service that runs it all for a cluster
(``_service``: RPC handlers, heartbeats, repair, collection), the lease that
makes one of several services the leader (``_leader``) and the
engines themselves (``engines``: SQLite for one host, PostgreSQL for
several). The embedded store runs the same namespace logic in-process.

May import: ``transport`` (the service reaches data nodes as a client does),
``wire`` and the store's shared modules; never ``node``, the ``client`` or
anything above it.
"""

from ._commits import INLINE_LIMIT, INLINE_MAX
from ._namespace import Namespace
from ._placement import LOCAL_NODE
from ._repo import Repository
from ._service import MetaService
from .engines import SQLiteRepository, is_postgres, open_postgres

__all__ = [
    "INLINE_LIMIT",
    "INLINE_MAX",
    "LOCAL_NODE",
    "MetaService",
    "Namespace",
    "Repository",
    "SQLiteRepository",
    "is_postgres",
    "open_postgres",
]
