"""The metadata service: names, files and chunks, kept in one engine.

Owns the metadata logic (``_metadata``: the components over one repository,
each handling its requests, registered beside their code in
``_operations``: the namespace, commits, quotas, chunk records, the node
registry, classes and tenants; ``_idempotency``: mutations applied once per
idempotency key), the repository interface an engine
implements (``_repo``), the placement of new chunks on nodes (``_placement``:
a pure function), the service that runs it all for a cluster
(``_service``: RPC handlers, heartbeats, and the leader's duties: repair,
conversion, and collection of chunks no file uses, ``_collect``), its read-only
status page (``_status_web`` over HTTP, ``_status`` its figures, ``_status_html``
the page), the lease that
makes one of several services the leader (``_leader``) and the
engines themselves (``engines``: SQLite for one host, PostgreSQL for
several). The embedded store runs the same namespace logic in-process.

May import: ``transport`` (the service reaches data nodes as a client does),
``wire`` and the store's shared modules; never ``node``, the ``client`` or
anything above it.
"""

from ._collect import COLLECT_CHUNKS, COLLECT_GRACE_S
from ._metadata import Metadata
from ._placement import LOCAL_NODE
from ._policy import INLINE_LIMIT, INLINE_MAX
from ._repo import Repository
from ._service import MetaService
from ._status_web import StatusPage
from ._sweep import SWEEP_GRACE_S
from .engines import (
    DEFAULT_KEEP_S,
    SCHEMA_VERSION,
    Backup,
    SQLiteRepository,
    backup,
    is_postgres,
    open_postgres,
    restore,
)

__all__ = [
    "COLLECT_CHUNKS",
    "COLLECT_GRACE_S",
    "DEFAULT_KEEP_S",
    "INLINE_LIMIT",
    "INLINE_MAX",
    "LOCAL_NODE",
    "SCHEMA_VERSION",
    "SWEEP_GRACE_S",
    "Backup",
    "MetaService",
    "Metadata",
    "Repository",
    "SQLiteRepository",
    "StatusPage",
    "backup",
    "is_postgres",
    "open_postgres",
    "restore",
]
