"""Client options: how a client reads and writes (``connect(url, options=...)``)."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Literal

from .._errors import InvalidArgument
from ._env import ENV_CHUNK_SIZE, env_int
from ._limits import DEFAULT_CHUNK_SIZE, MAX_CHUNK_SIZE
from ._tls import TLS, FilePath, tls_from_env

DEFAULT_REPLICA_DEADLINE = 3.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    """How a client reads and writes. Every field is keyword-only."""

    chunk_size: int = field(default_factory=lambda: env_int(ENV_CHUNK_SIZE, DEFAULT_CHUNK_SIZE))
    """Bytes per chunk for new files."""
    replication: int | None = None
    """Copies of each chunk; ``None`` takes the store's default (1 embedded)."""
    min_replicas: int | None = None
    """Copies a write needs when nodes are down (it goes on with fewer than ``replication``,
    and repair adds the rest); ``None`` takes the cluster's ``--min-replicas``."""
    timeout: float = 30.0
    """Seconds a request keeps retrying while the metadata service is unreachable (cannot
    connect, connection lost, no answer), moving to another of the cluster's services
    if there is one; refusals are never retried. Mutations are repeated with their
    idempotency key (applied once), and for at most 300 s whatever this says."""
    wait: float = 1.0
    """Seconds a client that has never reached the cluster keeps trying (a refused or
    unanswered connection) before it says so: a dead endpoint costs this, not
    ``timeout``. Raise it to wait for a cluster that is starting (``--wait``)."""
    replica_deadline: float = DEFAULT_REPLICA_DEADLINE
    """Seconds a chunk write waits for a data node once another node has its copy. A
    node past it (hung, or its disk dying) is passed over: the write goes on with
    the copies it has if they are at least ``min_replicas``, repair adds the rest,
    and the node is skipped by this client's writes and read last for 15 s."""
    max_inflight: int = 8
    """Chunks one writer hashes and uploads at once."""
    inline_max: int | None = None
    """Largest file this client has the metadata engine keep itself (no data node write:
    one round trip); ``None``: as large as the store keeps (``--inline-max``), 0: none."""
    read_ahead: int = 16
    """Chunks a sequential reader fetches ahead of the one it is on."""
    read_check: Literal["blake3", "crc32c"] = "blake3"
    """What a read from a data node checks: ``"blake3"``, that the bytes hash to the
    chunk's id (a copy damaged or rewritten on a node's disk is refused, reported for
    repair, and another read); ``"crc32c"``, only that they crossed the wire intact.
    An embedded store's own directory is checked by crc32c (and fsck, by blake3)."""
    io_threads: int = 4
    """Threads doing disk I/O for an embedded store."""
    hash_threads: int = 2
    """Threads hashing chunks (blake3, crc32c release the GIL)."""
    remote_read_ahead: int = 0
    """Chunks a sequential reader fetches ahead from a cluster into buffers of its
    own (memory: that many chunks). Measured over loopback on 2 cores it only
    cost (1.1 against 1.7 GB/s); on a real network it hides the round trips."""
    gc_grace_s: float = 3600.0
    """Age before unreferenced chunks, orphan chunk files and writers' temporaries may be
    collected (``fsck(grace=...)`` overrides it for one run)."""
    token: str | None = field(default=None, repr=False)
    """A cluster's client token: a tenant's (``graben token create``) or the cluster's
    own. ``None`` takes ``$GRABEN_TOKEN``, else the file ``$GRABEN_TOKEN_FILE``, else the
    one computed from the cluster secret (``$GRABEN_SECRET_FILE``). Ignored embedded."""
    token_file: FilePath | None = None
    """A file (0600) holding the client token, as ``--token-file`` names one: read when the
    client connects, and taken before ``$GRABEN_TOKEN``. Give this or ``token``, not
    both. Ignored embedded."""
    tls: TLS | ssl.SSLContext | None = field(default_factory=tls_from_env)
    """How to reach a cluster over TLS (a ``TLS``, or a client ``ssl.SSLContext`` of the
    caller's own); ``None``: plaintext. Default: ``$GRABEN_TLS_CA`` and friends, else
    plaintext. The server's name is checked against the host dialled. Ignored embedded."""

    def __post_init__(self) -> None:
        if not 4096 <= self.chunk_size <= MAX_CHUNK_SIZE:
            raise InvalidArgument(
                f"chunk_size must be between 4096 and {MAX_CHUNK_SIZE} bytes, not {self.chunk_size}"
            )
        if self.replication is not None and self.replication < 1:
            raise InvalidArgument(f"replication must be at least 1, not {self.replication}")
        if self.min_replicas is not None and self.min_replicas < 1:
            raise InvalidArgument(f"min_replicas must be at least 1, not {self.min_replicas}")
        for name in ("timeout", "wait", "replica_deadline"):
            if not getattr(self, name) > 0:
                raise InvalidArgument(
                    f"{name} must be a positive number of seconds, not {getattr(self, name)}"
                )
        for name in ("max_inflight", "io_threads", "hash_threads"):
            if getattr(self, name) < 1:
                raise InvalidArgument(f"{name} must be at least 1")
        if self.token is not None and self.token_file is not None:
            raise InvalidArgument("give a token or a token file (token_file=), not both")
        if self.read_check not in ("blake3", "crc32c"):
            raise InvalidArgument(f"read_check is blake3 or crc32c, not {self.read_check!r}")
        if self.read_ahead < 0:
            raise InvalidArgument("read_ahead must not be negative")
        if self.inline_max is not None and self.inline_max < 0:
            raise InvalidArgument(f"inline_max must not be negative, not {self.inline_max}")
