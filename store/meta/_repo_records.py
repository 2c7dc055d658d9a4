"""The repository's records beside the tree: who may use the store, what it has done, who
serves it.

Eight of the narrow protocols a transaction (``Tx`` in ``_repo.py``) holds, one per
concern, with the values they speak in: ``Tenants`` (tenants and their tokens),
``Quotas`` (directories' quotas and their usage), ``ChangeFeed`` (each path a write
changed), ``Keys`` (idempotency keys and their replies), ``Nodes`` (the data nodes),
``Services`` (the metadata services, the leader's lease and the engine's clock),
``BadCopies`` (copies reported damaged) and ``Identity`` (the store's id and sealing).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from .._types import ChunkRef, NodeState, PathChange, QuotaState, ServiceState, TokenInfo

GONE_S = 5.0
"""A metadata service not heard from for this long shows as gone (it beats every second)."""
TokenRow = tuple[TokenInfo, str]
"""A token as the engine keeps it: what ``token ls`` shows, and the digest of its secret."""


@dataclass(frozen=True, slots=True)
class Lease:
    """The one row saying which metadata service runs the background duties."""

    holder: str
    """The service id holding it; ``""`` before any has."""
    fence: int
    """Grows by one each time the lease passes to another holder."""
    expires: float
    """Unix time, by the engine's clock, after which another service may take it."""


def encrypted(sealed: str) -> bool:
    """Whether ``Identity.sealed``'s record says the store's chunk files are encrypted at rest."""
    return sealed not in ("", "none")


class Tenants(Protocol):
    """Tenants, each with its root, and the tokens they are given."""

    def add_tenant(self, name: str, root: str, made: float) -> bool:
        """Record a tenant and its root; ``False`` if the name is taken."""

    def tenants(self) -> dict[str, str]:
        """Every tenant's root, by name."""

    def add_token(self, row: TokenRow) -> None:
        """Record a new token (its id is new)."""

    def tokens(self, ids: Iterable[str] | None = None) -> list[TokenRow]:
        """These tokens (every one: ``None``), revoked ones too."""

    def revoke(self, ids: Sequence[str], tenant: str, now: float) -> int:
        """Revoke these tokens, or every token of ``tenant``; how many were live."""


class Quotas(Protocol):
    """The quotas set on directories, each with its tree's usage."""

    def quotas(self, paths: Iterable[str] | None = None) -> list[QuotaState]:
        """The quotas set at these paths (every one: ``None``), by path."""

    def quotas_within(self, path: str) -> list[QuotaState]:
        """The quotas at and below ``path``."""

    def set_quota(self, quota: QuotaState) -> None:
        """Set (or replace) the quota at ``quota.path``, with its usage."""

    def drop_quotas(self, path: str, *, tree: bool = True) -> int:
        """Forget the quota at ``path``, and (``tree``) those below it; how many."""

    def move_quotas(self, src: str, dst: str) -> None:
        """The quotas at and below ``src`` are now at and below ``dst`` (a rename)."""

    def add_usage(self, path: str, files: int, size: int, physical: int) -> QuotaState | None:
        """Add to the usage of the quota at ``path`` under its row's lock; the row after
        (``None``: no quota there)."""


class ChangeFeed(Protocol):
    """The change feed: each path a write changed, numbered in commit order."""

    def record_changes(self, changes: Sequence[tuple[str, int, int]], made_ns: int) -> None:
        """Add (path, inode, ctime_ns) rows to the change feed, numbered in order."""

    def forget_changes(self, older_than_ns: int, limit: int) -> int:
        """Delete up to ``limit`` feed rows made before ``older_than_ns``; how many went."""

    def changes_after(self, after: int, missing: Sequence[int], limit: int) -> list[PathChange]:
        """Feed rows numbered past ``after`` or in ``missing``, by number, at most ``limit``."""

    def change_bounds(self) -> tuple[int, int]:
        """The feed's first and last numbers kept (0, 0 when empty)."""


class Keys(Protocol):
    """Idempotency keys, each with the reply its mutation gave."""

    def outcomes(self, keys: Iterable[str]) -> dict[str, bytes]:
        """Of these idempotency keys, those recorded, each with its recorded reply."""

    def record_outcomes(self, outcomes: Iterable[tuple[str, bytes]], made_ns: int) -> None:
        """Record each key's reply (applied at ``made_ns``); a key already recorded is an
        error, so a mutation can never be recorded, and applied, twice."""

    def forget_outcomes(self, older_than_ns: int, limit: int) -> int:
        """Delete up to ``limit`` recorded replies made before ``older_than_ns``, oldest
        first; how many went."""


class Nodes(Protocol):
    """The registered data nodes."""

    def upsert_node(self, node: NodeState) -> None:
        """Register a data node or refresh what is known of it."""

    def nodes(self) -> list[NodeState]:
        """Every registered data node."""

    def set_node_state(self, node: str, state: str) -> bool:
        """Set a node's state (``""`` or ``"draining"``); whether it is registered."""

    def held(self) -> dict[str, int]:
        """Chunk copies and pieces each node holds, by node id (nodes holding none left out)."""

    def copies_on(self, node: str, limit: int) -> dict[str, tuple[str, ...]]:
        """Up to ``limit`` chunks with a copy on ``node``: every node holding one, by chunk."""

    def sole(self, node: str, limit: int) -> list[str]:
        """Up to ``limit`` chunks (and pieces) nowhere but on ``node``."""

    def forget_node(self, node: str) -> None:
        """Unregister a node and forget the copies it held (pieces there become lost)."""

    def held_bytes(self) -> dict[str, int]:
        """Bytes of chunk copies and pieces each node holds, by node id."""

    def movable(self, src: str, dst: str, limit: int) -> list[ChunkRef]:
        """Up to ``limit`` referenced chunks with a copy on ``src`` and none on ``dst``."""


class Services(Protocol):
    """The metadata services, the leader's lease, and the clock both are judged by."""

    def now(self) -> float:
        """Unix time by the engine's clock: every service judges leases and liveness by it."""

    def lease(self) -> Lease:
        """The leader's lease as it stands."""

    def set_lease(self, lease: Lease) -> None:
        """Replace the lease (the caller has looked at it in this transaction)."""

    def upsert_service(self, service: ServiceState) -> None:
        """Record a metadata service, or refresh what is known of it."""

    def services(self) -> list[ServiceState]:
        """Every recorded metadata service, by id."""

    def forget_services(self, ids: Iterable[str] = (), seen_before: float = 0.0) -> None:
        """Drop the services named, and those last seen before ``seen_before``."""

    def schema_version(self) -> int:
        """The engine's schema version as it stands now: a newer graben may have migrated
        it since this one opened the engine."""


class BadCopies(Protocol):
    """Copies of chunks reported damaged, awaiting the leader's deletion."""

    def add_bad(self, chunk: str, node: str, reason: str) -> None:
        """Remember a copy reported damaged, for the leader to delete."""

    def bad_copies(self, limit: int) -> list[tuple[str, str, str]]:
        """Up to ``limit`` copies reported damaged: (chunk, node, reason)."""

    def bad_count(self) -> int:
        """How many copies reported damaged await deletion."""

    def forget_bad(self, chunk: str, node: str) -> None:
        """Drop one reported copy (the leader has dealt with it)."""


class Identity(Protocol):
    """Which store this is, and whether its chunk files are encrypted at rest."""

    def store_id(self) -> str:
        """The store's id, made with the engine."""

    def sealed(self) -> str:
        """Whether the store's chunk files are encrypted at rest: its key's check value,
        ``"none"``, or ``""`` while nothing is recorded."""

    def seal(self, check: str) -> str:
        """Record ``check`` (a key's check value, or ``"none"``) as the store's encryption,
        unless one is recorded already; the one recorded."""

    def hold(self, name: str, taken_ns: int, until_ns: int) -> None:
        """Record a backup taken at ``taken_ns``: chunks unreferenced since then are not
        forgotten before ``until_ns``."""

    def restored_ns(self) -> int:
        """When the backup this store was restored from was taken (0: never restored)."""

    def mark_restored(self) -> int:
        """In a store just restored from a backup: remember when that backup (the newest
        hold) was taken and drop its hold; when it was taken (0: the backup has none)."""
