"""An embedded store that is not there yet: the first write makes it.

Opening an embedded store used to make one wherever it was pointed, so a
misspelt directory read as an empty store and left one behind. A path that
does not exist, or an empty directory, is made into a store by the first
request that writes (``MAKERS``: ``put``, ``mkdir``, a file opened for
writing). Until then nothing is made: the root reads as an empty directory
and ``WhoAmI`` as for any embedded store (what a mount or fsspec asks first
of a store they may be about to fill), ``GetHealth`` as an empty store on the
disk it will be on (a mount's ``df``), and every other request is
``NotFound`` naming the store's path. Another
process may make the store meanwhile: each request looks again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from .._errors import NotFound
from .._types import ChunkRef, FileInfo
from ..embedded import LocalChunks, LocalMeta, health_before_made, open_store
from ..transport import (
    Commit,
    CommitEach,
    GetHealth,
    GetSettings,
    ListDir,
    Listing,
    MakeDir,
    Prepare,
    Request,
    Stat,
    WhoAmI,
)

R = TypeVar("R")
MAKERS = (Prepare, Commit, CommitEach, MakeDir, GetSettings)
"""Requests that make a store: the writes, and the settings a writer asks for first."""
ROOT = FileInfo("/", "directory", 0, 0, 1, mode=0o755, nlink=2)
"""A new store's root (inode 1), as its engine makes it (dated when it is made)."""


def made(root: Path) -> bool:
    """Whether ``root`` is past making: anything but a missing path or an empty directory
    (a file there is ``open_store``'s to refuse)."""
    if not root.is_dir():
        return root.exists()
    return any(root.iterdir())


def unmade(root: Path, io_threads: int) -> tuple[UnmadeMeta, UnmadeChunks]:
    """Transports of the store ``root`` will hold, made by the first write."""
    store = _Later(root, io_threads)
    return UnmadeMeta(store), UnmadeChunks(store)


class _Later:
    """The store's transports, opened once it is made (by us or by another process)."""

    def __init__(self, root: Path, io_threads: int) -> None:
        self._root, self._threads = root, io_threads
        self._lock = threading.Lock()  # sync reads (``local_read``) come from any thread
        self.opened: tuple[LocalMeta, LocalChunks] | None = None
        now = time.time_ns()  # the root's times until it is made: not 1970
        self.root = msgspec.structs.replace(ROOT, mtime_ns=now, ctime_ns=now, atime_ns=now)

    def open(self, *, make: bool) -> tuple[LocalMeta, LocalChunks] | None:
        """The transports, the store made first if ``make``; ``None`` if it is not made."""
        if self.opened is None:
            with self._lock:
                if self.opened is None and (make or made(self._root)):
                    self.opened = open_store(self._root, self._threads)
        return self.opened

    def need(self, *, make: bool = False) -> tuple[LocalMeta, LocalChunks]:
        """The transports; ``NotFound`` naming the store's path if it is not made."""
        opened = self.open(make=make)
        if opened is None:
            raise self._missing()
        return opened

    def answer(self, request: Request[Any]) -> Any:
        """What a store not made yet answers: its root is an empty directory, and an
        embedded store's client may do anything (no tenant's token)."""
        if isinstance(request, WhoAmI):
            return None
        if isinstance(request, GetHealth):  # a mount's statfs: the disk it will be on
            return health_before_made(self._root)
        if isinstance(request, Stat) and request.path == "/":
            return self.root
        if isinstance(request, ListDir) and request.path == "/" and not request.directory:
            return Listing([], ROOT.inode)
        raise self._missing()

    def _missing(self) -> NotFound:
        return NotFound("no store here (a write makes one: put, mkdir)", str(self._root))


class UnmadeMeta:
    """``MetaTransport`` of a store not made yet: a request in ``MAKERS`` makes it."""

    def __init__(self, store: _Later) -> None:
        self._store = store

    async def request(self, request: Request[R]) -> R:
        opened = self._store.open(make=isinstance(request, MAKERS))
        if opened is None:
            answer: R = self._store.answer(request)
            return answer
        return await opened[0].request(request)

    @property
    def local_read(self) -> Callable[[Request[Any]], Any]:
        return self._read_now

    def _read_now(self, request: Request[Any]) -> Any:
        opened = self._store.open(make=False)
        if opened is None:
            return self._store.answer(request)
        return opened[0].local_read(request)

    async def close(self) -> None:
        if self._store.opened is not None:
            await self._store.opened[0].close()


class UnmadeChunks:
    """``ChunkTransport`` of a store not made yet: a chunk write makes it (after its
    ``Prepare`` has, in practice); anything else needs it made."""

    def __init__(self, store: _Later) -> None:
        self._store = store

    def _chunks(self, *, make: bool = False) -> LocalChunks:
        return self._store.need(make=make)[1]

    @property
    def prefetch_window(self) -> int:
        return self._chunks().prefetch_window

    @property
    def local_read(self) -> Callable[[str, ChunkRef, memoryview], None]:
        return self._read_now

    def _read_now(self, node: str, chunk: ChunkRef, into: memoryview) -> None:
        self._chunks().local_read(node, chunk, into)

    async def nodes(self) -> tuple[str, ...]:
        return await self._chunks().nodes()

    async def write(self, node: str, chunk: ChunkRef, data: memoryview) -> None:
        await self._chunks(make=True).write(node, chunk, data)

    async def read(self, node: str, chunk: ChunkRef, into: memoryview) -> None:
        await self._chunks().read(node, chunk, into)

    async def prefetch(self, node: str, chunks: Sequence[ChunkRef]) -> int:
        return await self._chunks().prefetch(node, chunks)

    async def inventory(self, node: str, store: str, after: str = "") -> list[tuple[str, float]]:
        return await self._chunks().inventory(node, store, after)

    async def temporaries(
        self, node: str, store: str, after: str = ""
    ) -> list[tuple[str, int, float]]:
        return await self._chunks().temporaries(node, store, after)

    async def clean(self, node: str, store: str, older_than: float) -> tuple[int, int]:
        return await self._chunks().clean(node, store, older_than)

    async def adoption(self, node: str, store: str, *, vouch: bool = False) -> bool:
        return await self._chunks().adoption(node, store, vouch=vouch)

    async def delete(self, node: str, chunk_id: str, older_than: float) -> bool:
        return await self._chunks().delete(node, chunk_id, older_than)

    def describe(self, node: str, chunk_id: str) -> str:
        return self._chunks().describe(node, chunk_id)

    def describe_temporary(self, node: str, name: str) -> str:
        return self._chunks().describe_temporary(node, name)

    async def close(self) -> None:
        if self._store.opened is not None:
            await self._store.opened[1].close()
