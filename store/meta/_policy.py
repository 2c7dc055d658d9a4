"""What the metadata components share of the store: its id and its defaults.

One ``Policy`` is made with the service (or the embedded store) and handed to
each component that needs it; nothing else is shared between them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._errors import InvalidArgument

INLINE_MAX = 64 * 1024
"""Files up to this size are kept in the metadata engine unless a service says otherwise."""
INLINE_LIMIT = 1 << 20
"""The most a service's ``inline_max`` may be: larger files belong on the data nodes."""


@dataclass(slots=True)
class Policy:
    """The store's id and defaults (``inline_max`` drops to 0 once the store is sealed:
    an encrypted store keeps no file's bytes in the engine)."""

    store_id: str
    default_replication: int = 1
    min_replicas: int = 0
    """Copies a write needs at least (0: one fewer than it asks for, at least 1)."""
    heartbeat_timeout: float = 10.0
    """Seconds after its last heartbeat a data node counts as down."""
    inline_max: int = INLINE_MAX
    collect_grace_s: float | None = None
    """How long a chunk stays unused before the leader collects it (``None``: nothing
    collects by itself, as in an embedded store: ``fsck --collect`` does)."""

    def __post_init__(self) -> None:
        if self.min_replicas < 0:
            raise InvalidArgument(f"min_replicas must be at least 1, not {self.min_replicas}")
        if not 0 <= self.inline_max <= INLINE_LIMIT:
            raise InvalidArgument(
                f"inline_max must be 0 to {INLINE_LIMIT} bytes, not {self.inline_max}"
            )
