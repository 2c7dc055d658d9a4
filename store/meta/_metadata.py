"""The metadata logic: every component over one repository, and the requests they handle.

``Metadata`` makes the components, each handed what it works with: the
namespace (names and attributes), commits (placing chunks, committing files),
quotas, chunk records (fsck, repair, collection: ``records``), the node registry, storage
classes, tenants and node drains. It runs a ``Request`` with the handler a component
registered for it (``_operations.py``). Stateless beyond its repository and
``Policy``, so an embedded store runs it in-process and a metadata service
runs the same code for remote clients.
"""

from __future__ import annotations

from typing import TypeVar

from .._types import ChunkRef
from ..transport import Request
from ._chunks import ChunkRecords
from ._classes import Classes
from ._commits import Commits, Placer
from ._drain import Drains
from ._namespace import Namespace
from ._nodes import NodeRegistry
from ._operations import Handlers
from ._placement import LOCAL_NODE
from ._policy import INLINE_MAX, Policy
from ._quotas import Quotas
from ._repo import Repository
from ._tenants import Tenants

R = TypeVar("R")


def local_placement(
    chunk: ChunkRef, replication: int, minimum: int, avoid: tuple[str, ...]
) -> tuple[str, ...]:
    """Embedded placement: every chunk lives on the one local node."""
    return (LOCAL_NODE,)


class Metadata:
    """The metadata components over ``repo``, and ``execute`` for requests."""

    def __init__(
        self,
        repo: Repository,
        place: Placer = local_placement,
        *,
        default_replication: int = 1,
        min_replicas: int = 0,
        heartbeat_timeout: float = 10.0,
        inline_max: int = INLINE_MAX,
    ) -> None:
        with repo.read() as tx:
            store_id = tx.identity.store_id()
        self.repo = repo
        self.policy = Policy(
            store_id, default_replication, min_replicas, heartbeat_timeout, inline_max
        )
        self.nodes = NodeRegistry(repo, self.policy)
        self.quotas = Quotas(repo, self.policy)
        self.commits = Commits(repo, self.policy, self.quotas, place)
        self.namespace = Namespace(repo, self.quotas, self.commits)
        self.records = ChunkRecords(repo, self.nodes)
        self.classes = Classes(repo)
        self.tenants = Tenants(repo, self.quotas)
        self.drains = Drains(repo, self.nodes)
        self.handlers = Handlers(
            self.namespace,
            self.commits,
            self.quotas,
            self.records,
            self.nodes,
            self.classes,
            self.tenants,
            self.drains,
        )

    @property
    def store_id(self) -> str:
        """The store's id: data nodes and capabilities of another store are refused."""
        return self.policy.store_id

    def execute(self, request: Request[R]) -> R:
        """Run one request and return its response."""
        return self.handlers.run(request)
