"""graben.store: the chunked, replicated object store and its clients.

``connect(url)`` opens a store and returns a ``Client``; ``AsyncClient`` is
the same API for asyncio code. Every error is a ``GrabenError`` that also
subclasses the builtin it means.
"""

from ._aclient import AsyncClient
from ._afiles import AsyncReadFile, AsyncWriteFile
from ._client import Client, connect
from ._config import Options, split_url
from ._errors import (
    AlreadyExists,
    DirectoryNotEmpty,
    GrabenError,
    IntegrityError,
    InvalidArgument,
    InvalidPath,
    IsADirectory,
    NoSpace,
    NotADirectory,
    NotFound,
    PermissionDenied,
    ProtocolError,
    Timeout,
    Unavailable,
)
from ._files import ReadFile, WriteFile
from ._fsspec import GrabenFileSystem
from ._paths import normalize as normalize_path
from ._types import ChunkProblem, FileInfo, FsckReport

__all__ = [
    "AlreadyExists",
    "AsyncClient",
    "AsyncReadFile",
    "AsyncWriteFile",
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
    "NoSpace",
    "NotADirectory",
    "NotFound",
    "Options",
    "PermissionDenied",
    "ProtocolError",
    "ReadFile",
    "Timeout",
    "Unavailable",
    "WriteFile",
    "connect",
    "normalize_path",
    "split_url",
]
