"""graben.store: the chunked, replicated object store and its clients.

``connect(url)`` opens a store and returns a ``Client``; ``AsyncClient`` is
the same API for asyncio code; ``shared_client(url)`` is the process's one
client for a store, which every door uses; ``TLS`` says how to reach a cluster over TLS
(``connect(url, tls=TLS(ca=...))``, or ``$GRABEN_TLS_CA``); ``parse_size``
reads a size as people write it (``"50G"``). Every error is a ``GrabenError``
that also subclasses the builtin it means. ``optional_door`` is for graben's
own doors: importing one without its extra raises ``MissingExtra`` (an
``ImportError``) naming it; ``serve_metrics`` serves a Prometheus registry
at ``/metrics``, as the servers and the mount daemon do.
"""

from ._config import TLS, Options, cache_home, parse_size, split_url
from ._errors import (
    AlreadyExists,
    CannotPlace,
    DirectoryNotEmpty,
    GrabenError,
    IntegrityError,
    InvalidArgument,
    InvalidPath,
    IsADirectory,
    MissingExtra,
    NameTooLong,
    NoSpace,
    NotADirectory,
    NotFound,
    PermissionDenied,
    ProtocolError,
    Refused,
    Timeout,
    TLSError,
    Unavailable,
)
from ._extras import optional_door
from ._paths import normalize as normalize_path
from ._types import Change, ChunkProblem, FileInfo, FsckReport
from .client import (
    AsyncClient,
    AsyncReadFile,
    AsyncWriteFile,
    Client,
    ReadFile,
    Upload,
    WriteFile,
    clear_shared_clients,
    connect,
    shared_client,
)
from .fsspec import GrabenFileSystem
from .wire import serve_metrics

__all__ = [
    "TLS",
    "AlreadyExists",
    "AsyncClient",
    "AsyncReadFile",
    "AsyncWriteFile",
    "CannotPlace",
    "Change",
    "ChunkProblem",
    "Client",
    "DirectoryNotEmpty",
    "FileInfo",
    "FsckReport",
    "GrabenError",
    "GrabenFileSystem",
    "IntegrityError",
    "InvalidArgument",
    "InvalidPath",
    "IsADirectory",
    "MissingExtra",
    "NameTooLong",
    "NoSpace",
    "NotADirectory",
    "NotFound",
    "Options",
    "PermissionDenied",
    "ProtocolError",
    "ReadFile",
    "Refused",
    "TLSError",
    "Timeout",
    "Unavailable",
    "Upload",
    "WriteFile",
    "cache_home",
    "clear_shared_clients",
    "connect",
    "normalize_path",
    "optional_door",
    "parse_size",
    "serve_metrics",
    "shared_client",
    "split_url",
]
