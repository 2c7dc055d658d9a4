"""The sizes clients and servers, or a data node and the metadata service's placement,
agree on: chunk sizes, a page's entries, the room a disk keeps free."""

from __future__ import annotations

from .._errors import InvalidArgument
from ._env import ENV_PAGE_ENTRIES, env_int

MiB = 1 << 20
DEFAULT_CHUNK_SIZE = 8 * MiB
MAX_CHUNK_SIZE = 256 * MiB
PAGE_ENTRIES = 128
"""Entries in one page of a list-shaped reply (fsck's chunk records, a node's inventory,
collection). A page of chunk records with their read capabilities is ~60 KiB: far
under the wire's header limit (1 MiB, and a receiver's 256 KiB inbox, which a header
must fit); a store of any size is just more pages."""
RESERVE = 64 << 20
"""Bytes a node keeps free beyond the chunk, so a disk stops taking chunks before it fills."""


REFUSE_SHARE = 0.1
"""Collection deletes no orphan when they are more than this share of the chunk files ..."""
REFUSE_FEW = 64
"""... and more than this many (a killed writer's few never trip it)."""


def too_many_orphans(orphans: int, held: int) -> bool:
    """Whether ``orphans`` of the ``held`` chunk files, named by no metadata, are more
    than crashed writers leave: what a wrong, empty or old metadata database looks like,
    where deleting them would delete live data (fsck's collection and the leader's sweep
    both refuse then)."""
    return orphans > REFUSE_FEW and orphans > REFUSE_SHARE * held


def page_entries(asked: int = 0, default: int = PAGE_ENTRIES) -> int:
    """Entries per page: ``asked`` if positive and smaller, else ``$GRABEN_PAGE_ENTRIES``
    (tests lower it to cross many pages), else ``default``."""
    most = env_int(ENV_PAGE_ENTRIES, default)
    if most < 1:
        raise InvalidArgument(f"${ENV_PAGE_ENTRIES} must be at least 1, not {most}")
    return min(asked, most) if asked > 0 else most
