"""The wire: how the store's processes talk, knowing nothing of files.

Owns the frame protocol (``_frames``: length-prefixed frames, a msgpack
header, a payload received straight into the receiver's buffer), RPC on top
of it (``_rpc``: multiplexed client connections, servers; ``_tasks``: periodic tasks),
the cluster's auth primitives (``auth``: the shared secret, client tokens,
chunk capabilities), TLS (``tls``: contexts from ``TLS`` values, failures
told as refusals) and each server's Prometheus metrics (``_metrics``).

May import: the store's shared modules only (``graben.store._types``,
``_errors``, ...); every other layer may import this one.
"""

from . import _auth as auth
from . import _tls as tls
from ._frames import Call, FileSpan, WireError, decode, encode, from_wire, to_wire
from ._metrics import (
    BESIDE,
    METRICS_OFFSET,
    WILDCARDS,
    Metrics,
    dialled,
    serve_if_asked,
    serve_metrics,
)
from ._rpc import (
    CLIENT_IDLE_S,
    CONNECT_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_TIMEOUT,
    Answer,
    Connection,
    Handler,
    PayloadSink,
    Server,
)
from ._tasks import every, stop

__all__ = [
    "BESIDE",
    "CLIENT_IDLE_S",
    "CONNECT_TIMEOUT",
    "DEFAULT_IDLE_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "METRICS_OFFSET",
    "WILDCARDS",
    "Answer",
    "Call",
    "Connection",
    "FileSpan",
    "Handler",
    "Metrics",
    "PayloadSink",
    "Server",
    "WireError",
    "auth",
    "decode",
    "dialled",
    "encode",
    "every",
    "from_wire",
    "serve_if_asked",
    "serve_metrics",
    "stop",
    "tls",
    "to_wire",
]
