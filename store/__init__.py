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
directory that must be the user's alone, walked from ``/``; ``LogFormatter``
writes graben's log lines, control characters escaped.
"""

import importlib

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (and re)

# The door's names, listed here alone: ``__getattr__`` imports each from its module
# when it is first used (read from this block: ``_homes``), so ``import graben.store``
# is cheap and the ``graben`` command handles Ctrl-C from its first line on; type
# checkers read the imports ("X as X": a name this door re-exports); ``__all__`` is
# every name of the block.
if TYPE_CHECKING:
    from ._classes import check_class as check_class
    from ._config import TLS as TLS
    from ._config import Options as Options
    from ._config import aws_environment as aws_environment
    from ._config import cache_home as cache_home
    from ._config import parse_size as parse_size
    from ._config import split_url as split_url
    from ._errors import AlreadyExists as AlreadyExists
    from ._errors import CannotPlace as CannotPlace
    from ._errors import CrossDevice as CrossDevice
    from ._errors import DirectoryNotEmpty as DirectoryNotEmpty
    from ._errors import GrabenError as GrabenError
    from ._errors import IntegrityError as IntegrityError
    from ._errors import InvalidArgument as InvalidArgument
    from ._errors import InvalidPath as InvalidPath
    from ._errors import IsADirectory as IsADirectory
    from ._errors import MissingExtra as MissingExtra
    from ._errors import NameTooLong as NameTooLong
    from ._errors import NoSpace as NoSpace
    from ._errors import NotADirectory as NotADirectory
    from ._errors import NotFound as NotFound
    from ._errors import PermissionDenied as PermissionDenied
    from ._errors import ProtocolError as ProtocolError
    from ._errors import QuotaExceeded as QuotaExceeded
    from ._errors import Refused as Refused
    from ._errors import Timeout as Timeout
    from ._errors import TLSError as TLSError
    from ._errors import Unavailable as Unavailable
    from ._extras import optional_door as optional_door
    from ._paths import normalize_path as normalize_path
    from ._paths import private_child as private_child
    from ._paths import private_dir as private_dir
    from ._paths import trusted_dir as trusted_dir
    from ._types import Change as Change
    from ._types import ChangeFeed as ChangeFeed
    from ._types import ChunkProblem as ChunkProblem
    from ._types import ClassState as ClassState
    from ._types import Collection as Collection
    from ._types import FileCommit as FileCommit
    from ._types import FileInfo as FileInfo
    from ._types import FsckReport as FsckReport
    from ._types import PathChange as PathChange
    from ._types import QuotaState as QuotaState
    from ._types import TokenInfo as TokenInfo
    from .cli._logs import LogFormatter as LogFormatter
    from .client import AgentClient as AgentClient
    from .client import AsyncClient as AsyncClient
    from .client import AsyncReadFile as AsyncReadFile
    from .client import AsyncWriteFile as AsyncWriteFile
    from .client import Client as Client
    from .client import ReadFile as ReadFile
    from .client import Upload as Upload
    from .client import WriteFile as WriteFile
    from .client import WriteOptions as WriteOptions
    from .client import adopt_loop as adopt_loop
    from .client import clear_shared_clients as clear_shared_clients
    from .client import connect as connect
    from .client import shared_client as shared_client
    from .fsspec import GrabenFileSystem as GrabenFileSystem
    from .transport import Held as Held
    from .transport import SegmentKey as SegmentKey
    from .wire import serve_metrics as serve_metrics
    from .wire._auth import read_token_file as read_token_file

_found: dict[str, tuple[str, str]] = {}
"""Each public name: its module (relative) and its name there, once ``_homes`` has
read the block above."""


def _homes() -> dict[str, tuple[str, str]]:
    """Where each name of the ``TYPE_CHECKING`` block lives, read from this file's source
    on the first look-up (so ``import graben.store`` imports no ``ast``)."""
    if not _found:
        import ast

        with open(__file__, encoding="utf-8") as source:
            tree = ast.parse(source.read())
        block = next(node for node in tree.body if isinstance(node, ast.If))
        for node in block.body:
            if isinstance(node, ast.ImportFrom):
                module = "." * node.level + (node.module or "")
                for alias in node.names:
                    _found[alias.asname or alias.name] = (module, alias.name)
    return _found


def __getattr__(name: str) -> object:
    """Import what a name needs on first use, so ``import graben.store`` is cheap
    (the ``graben`` command handles Ctrl-C from its first line on)."""
    if name == "__all__":
        value: object = sorted(_homes())
    elif name in _homes():
        module, attr = _homes()[name]
        value = getattr(importlib.import_module(module, __name__), attr)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_homes()))
