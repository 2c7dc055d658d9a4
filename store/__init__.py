"""graben.store: the chunked, replicated object store and its clients.

``connect(url)`` opens a store and returns a ``Client``; ``AsyncClient`` is
the same API for asyncio code; ``shared_client(url)`` is the process's one
client for a store, which every door uses; ``TLS`` says how to reach a cluster over TLS
(``connect(url, tls=TLS(ca=...))``, or ``$GRABEN_TLS_CA``); ``parse_size``
reads a size as people write it (``"50G"``). Every error is a ``GrabenError``
that also subclasses the builtin it means. ``optional_door`` is for graben's
own doors: importing one without its extra raises ``MissingExtra`` (an
``ImportError``) naming it; ``serve_metrics`` serves a Prometheus registry
at ``/metrics``, as the servers and the mount daemon do; ``AgentClient``
(with ``SegmentKey`` and ``Held``) talks to a node's memory agent;
``private_dir`` (with ``trusted_dir`` and ``private_child``) opens a local
directory that must be the user's alone, walked from ``/``.
"""

import importlib

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (and re)

if TYPE_CHECKING:
    from ._config import (
        TLS,
        Options,
        aws_environment,
        cache_home,
        parse_size,
        split_url,
    )
    from ._errors import (
        AlreadyExists,
        CannotPlace,
        CrossDevice,
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
        QuotaExceeded,
        Refused,
        Timeout,
        TLSError,
        Unavailable,
    )
    from ._extras import optional_door
    from ._paths import normalize as normalize_path
    from ._paths import private_child, private_dir, trusted_dir
    from ._types import (
        Change,
        ChangeFeed,
        ChunkProblem,
        ClassState,
        FileInfo,
        FsckReport,
        PathChange,
        QuotaState,
        TokenInfo,
    )
    from .client import (
        AgentClient,
        AsyncClient,
        AsyncReadFile,
        AsyncWriteFile,
        Client,
        ReadFile,
        Upload,
        WriteFile,
        WriteOptions,
        clear_shared_clients,
        connect,
        shared_client,
    )
    from .fsspec import GrabenFileSystem
    from .transport import Held, SegmentKey
    from .transport._classes import check as check_class
    from .wire import serve_metrics
    from .wire._auth import read_token_file

# Where each name lives ("name=its name there" where they differ).
_MODULES = {
    "._config": "TLS Options aws_environment cache_home parse_size split_url",
    "._errors": (
        "AlreadyExists CannotPlace CrossDevice DirectoryNotEmpty GrabenError IntegrityError"
        " InvalidArgument InvalidPath IsADirectory MissingExtra NameTooLong NoSpace"
        " NotADirectory NotFound PermissionDenied ProtocolError QuotaExceeded Refused"
        " Timeout TLSError Unavailable"
    ),
    "._extras": "optional_door",
    "._paths": "normalize_path=normalize private_child private_dir trusted_dir",
    "._types": (
        "Change ChangeFeed ChunkProblem ClassState FileInfo FsckReport PathChange QuotaState"
        " TokenInfo"
    ),
    ".client": (
        "AgentClient AsyncClient AsyncReadFile AsyncWriteFile Client ReadFile Upload WriteFile"
        " WriteOptions clear_shared_clients connect shared_client"
    ),
    ".fsspec": "GrabenFileSystem",
    ".transport": "Held SegmentKey",
    ".transport._classes": "check_class=check",
    ".wire": "serve_metrics",
    ".wire._auth": "read_token_file",
}
_WHERE = {
    name.partition("=")[0]: (module, name.partition("=")[2] or name)
    for module, names in _MODULES.items()
    for name in names.split()
}


def __getattr__(name: str) -> object:
    """Import what a name needs on first use, so ``import graben.store`` is cheap
    (the ``graben`` command handles Ctrl-C from its first line on)."""
    try:
        module, attr = _WHERE[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module, __name__), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "TLS",
    "AgentClient",
    "AlreadyExists",
    "AsyncClient",
    "AsyncReadFile",
    "AsyncWriteFile",
    "CannotPlace",
    "Change",
    "ChangeFeed",
    "ChunkProblem",
    "ClassState",
    "Client",
    "CrossDevice",
    "DirectoryNotEmpty",
    "FileInfo",
    "FsckReport",
    "GrabenError",
    "GrabenFileSystem",
    "Held",
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
    "PathChange",
    "PermissionDenied",
    "ProtocolError",
    "QuotaExceeded",
    "QuotaState",
    "ReadFile",
    "Refused",
    "SegmentKey",
    "TLSError",
    "Timeout",
    "TokenInfo",
    "Unavailable",
    "Upload",
    "WriteFile",
    "WriteOptions",
    "aws_environment",
    "cache_home",
    "check_class",
    "clear_shared_clients",
    "connect",
    "normalize_path",
    "optional_door",
    "parse_size",
    "private_child",
    "private_dir",
    "read_token_file",
    "serve_metrics",
    "shared_client",
    "split_url",
    "trusted_dir",
]
