"""The metadata repository interface: what an engine must provide.

An engine (SQLite for one host, PostgreSQL for several) offers transactions
over three layers: names ``(parent, name) -> inode``, files ``inode ->
attributes, extents`` and chunks ``id -> length, crc32c, refs, replicas``,
and the records beside them. A transaction (``Tx``) holds one narrow
protocol per concern as an attribute: ``tx.tree`` (names, inodes, locks),
``tx.files`` (extents), ``tx.chunks`` (chunks and replicas), ``tx.stripes``
(classes and pieces), in ``_repo_tree.py``; ``tx.tenants``, ``tx.quotas``,
``tx.feed`` (the change feed), ``tx.keys`` (idempotency keys), ``tx.nodes``,
``tx.services`` (services, the lease, the clock), ``tx.bad`` (damaged
copies) and ``tx.identity`` (the store's id, its sealing), in
``_repo_records.py``. The namespace logic in ``_namespace.py`` is written
once against these primitives. This module is the interface's one door:
the engines import all of it from here.

Call order: open a read with ``read()`` and use the returned ``Tx`` only
inside the ``with`` block. A write is a function of a ``Tx``, handed to
``transact``: it commits durably when the function returns and rolls back
when it raises. The engine may run the function again, from the start and in
a new transaction, when a concurrent writer changed what it read (PostgreSQL
lets writers of several services commit side by side); so the function
keeps no state outside its transaction between runs, and its last run's
result is the one returned. The namespace logic looks, then acts, inside one
function; what it relies on stays true to the commit because each primitive
either takes a row lock or raises ``Conflict`` when a concurrent writer
got there first (see docs/architecture.md, "Writes side by side").
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol, TypeVar

from .._types import ChunkProblem
from ._repo_records import (
    GONE_S,
    BadCopies,
    ChangeFeed,
    Identity,
    Keys,
    Lease,
    Nodes,
    Quotas,
    Services,
    Tenants,
    TokenRow,
    encrypted,
)
from ._repo_tree import (
    IN_TIER,
    INODE_COLUMNS,
    NEW_INODE_COLUMNS,
    ROOT_INODE,
    ChunkRecord,
    Chunks,
    Degraded,
    Files,
    Forgotten,
    Inode,
    NewFile,
    Stripes,
    Tree,
    new_values,
    tiling_problem,
)

__all__ = [
    "GONE_S",
    "INODE_COLUMNS",
    "IN_TIER",
    "NEW_INODE_COLUMNS",
    "ROOT_INODE",
    "BadCopies",
    "ChangeFeed",
    "ChunkRecord",
    "Chunks",
    "Conflict",
    "Degraded",
    "Files",
    "Forgotten",
    "Identity",
    "Inode",
    "Keys",
    "Lease",
    "NewFile",
    "Nodes",
    "Quotas",
    "R",
    "Repository",
    "Services",
    "Stripes",
    "Tenants",
    "TokenRow",
    "Tree",
    "Tx",
    "encrypted",
    "new_values",
    "tiling_problem",
]

R = TypeVar("R")


class Conflict(Exception):
    """A concurrent writer changed what this transaction relied on (the row it meant to
    change is gone, or it took a reference on a chunk collected meanwhile): the engine runs
    the transaction again. Never seen outside an engine's ``transact``."""


class Tx(Protocol):
    """One transaction: a narrow protocol per concern, all in the one transaction."""

    @property
    def tree(self) -> Tree:
        """Names and the inodes they name, and their locks."""

    @property
    def files(self) -> Files:
        """Files' extents and their chunk references."""

    @property
    def chunks(self) -> Chunks:
        """Chunks, their replicas, their collection."""

    @property
    def stripes(self) -> Stripes:
        """Storage classes and erasure-coded chunks' pieces."""

    @property
    def tenants(self) -> Tenants:
        """Tenants and their tokens."""

    @property
    def quotas(self) -> Quotas:
        """Directories' quotas and their usage."""

    @property
    def feed(self) -> ChangeFeed:
        """The change feed."""

    @property
    def keys(self) -> Keys:
        """Idempotency keys and their replies."""

    @property
    def nodes(self) -> Nodes:
        """The data nodes."""

    @property
    def services(self) -> Services:
        """The metadata services, the leader's lease, the engine's clock."""

    @property
    def bad(self) -> BadCopies:
        """Copies reported damaged."""

    @property
    def identity(self) -> Identity:
        """The store's id and its sealing."""

    def savepoint(self) -> AbstractContextManager[None]:
        """A nested unit: an exception in the block undoes the block's changes only."""

    def inconsistencies(self, limit: int) -> list[ChunkProblem]:
        """Up to ``limit`` places where the tables contradict each other or hold
        values that do not decode (what fsck reports as ``metadata``)."""


class Repository(Protocol):
    """An engine: hands out transactions."""

    def read(self) -> AbstractContextManager[Tx]:
        """A consistent read-only view."""

    def transact(self, work: Callable[[Tx], R]) -> R:
        """``work`` in a write transaction that commits durably when it returns; run
        again from the start (a new transaction) while a concurrent writer conflicts."""

    @property
    def location(self) -> str:
        """The engine as an operator names it, without secrets: ``sqlite:///path`` or
        ``postgresql://user@host:port/db``."""

    def close(self) -> None:
        """Release the engine's connections."""
