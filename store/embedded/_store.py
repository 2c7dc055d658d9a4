"""The embedded store: metadata logic and chunk store in-process on a directory.

Layout of the store directory: ``meta.db`` (SQLite, WAL), ``chunks/``,
``store-id`` (the id in ``meta.db``, so another store's database is refused) and
``sealed`` (whether chunk files are encrypted, and under which key; ``meta.db``
records it too, and decides: a store opened without its key is refused).
A new or empty directory becomes a new store; a directory that holds chunk
files but no metadata is refused, never taken for a new, empty store (its
first collection would delete every chunk).
Metadata requests run on one dedicated thread (one SQLite connection); chunk
I/O on a small pool. Several processes may open the same directory at once:
SQLite's locks keep the metadata consistent and chunk files are written
atomically under content-addressed names.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, cast

import msgspec

from .._batcher import Batcher
from .._buffers import in_thread
from .._config import encryption_key_file, page_entries
from .._errors import (
    IntegrityError,
    InvalidArgument,
    NotADirectory,
    NotFound,
    Unavailable,
    from_os_error,
)
from .._types import ChunkRef, Health, NodeState, Receipt
from ..meta import LOCAL_NODE, Metadata, SQLiteRepository
from ..node import (
    DIR_MODE,
    GROUP_SYNC_MAX,
    LocalChunkStore,
    adoption,
    bytes_under,
    check_sealing,
    disk_space,
    keep_store_id,
    load_key,
    read_id,
    seal_directory,
)
from ..transport import (
    Commit,
    GetHealth,
    Request,
)
from ..wire import auth

R = TypeVar("R")
HINT_THREADS = 4
READERS = 2
"""Threads answering reads (stat, listings, layouts) beside the one writer."""


def open_store(root: Path, io_threads: int) -> tuple[LocalMeta, LocalChunks]:
    """Open (creating if needed) the embedded store at ``root``."""
    try:
        root.mkdir(DIR_MODE, parents=True, exist_ok=True)
        key = encryption_key_file()
        sealer = None if key is None else load_key(key)
        chunks = LocalChunkStore(root / "chunks", hashed_here=True, sealer=sealer)  # writers here
        seal_directory(root, sealer, chunks)
    except (FileExistsError, NotADirectoryError):
        raise NotADirectory(
            "an embedded store must be a directory; this is a file", str(root)
        ) from None
    except OSError as exc:
        raise from_os_error(exc, str(root)) from exc
    try:
        repo = _open_engine(root, chunks)
    except BaseException:
        chunks.close()
        raise
    try:
        metadata = Metadata(repo)
        _check_identity(root, metadata, chunks)
        mine = "none" if sealer is None else sealer.check
        check_sealing(f"the store at {root}", metadata.nodes.sealed(mine), sealer)
    except BaseException:
        repo.close()
        chunks.close()
        raise
    usage = partial(bytes_under, root)
    return LocalMeta(metadata, chunks.capacity, usage), LocalChunks(chunks, io_threads)


def _open_engine(root: Path, chunks: LocalChunkStore) -> SQLiteRepository:
    """The store's engine; a new one only where there are no chunks yet."""
    create = not chunks.inventory(limit=1)
    try:
        return SQLiteRepository(root / "meta.db", create=create)
    except NotFound:
        raise IntegrityError(
            "this store holds chunk files but its metadata database is missing or empty; "
            "refusing to start a new, empty store over them (restore meta.db from a backup)",
            str(root / "meta.db"),
        ) from None


def _check_identity(root: Path, metadata: Metadata, chunks: LocalChunkStore) -> None:
    """Keep the engine's store id beside the chunks (marked adopted if chunk files are
    already there: nothing shows they are this database's); refuse another store's
    ``meta.db``."""
    path = root / "store-id"
    kept = read_id(path)
    if kept is None:
        keep_store_id(root, metadata.store_id, chunks)
    elif kept != metadata.store_id:
        raise IntegrityError(
            f"meta.db belongs to another store ({metadata.store_id}); the chunks here "
            f"belong to store {kept} (see {path})",
            str(root / "meta.db"),
        )


class LocalMeta:
    """``MetaTransport`` running the metadata logic: mutations on one thread (SQLite has
    one writer), reads on threads of their own, so a lookup never waits behind a
    commit's fsync (WAL readers do not block on the writer)."""

    def __init__(
        self,
        metadata: Metadata,
        capacity: Callable[[], tuple[int, int]],
        stored: Callable[[], int] = lambda: 0,
    ) -> None:
        """``capacity``: the disk's (free, total) bytes; ``stored``: the bytes the store's
        files take on it (read at each ``GetHealth``)."""
        self.metadata = metadata
        self._capacity, self._stored = capacity, stored
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="graben-meta")
        self._readers = ThreadPoolExecutor(READERS, thread_name_prefix="graben-meta-read")
        self._group = Batcher(partial(self._run, metadata.commits.commit_group), size=len)

    async def request(self, request: Request[R]) -> R:
        if isinstance(request, Commit):
            infos: R = await self._group.submit(request.files)  # type: ignore[assignment]
            return infos
        if isinstance(request, GetHealth):
            health: Any = await self._run(self._health)
            return cast(R, health)
        pool = self._readers if request.rule.reads else self._thread
        loop = asyncio.get_running_loop()
        result: R = await loop.run_in_executor(pool, self.metadata.execute, request)
        return result

    @property
    def local_read(self) -> Callable[[Request[Any]], Any]:
        return self._read_now

    def _read_now(self, request: Request[Any]) -> Any:
        if not request.rule.reads:
            raise InvalidArgument(f"{type(request).__name__} is not a read")
        return self.metadata.execute(request)

    def _health(self) -> Health:
        # No heartbeats here: the one node is the directory, and always there.
        health = self.metadata.nodes.health()
        local = msgspec.structs.replace(_local(*self._capacity()), stored=self._stored())
        return msgspec.structs.replace(health, nodes=[local])

    async def _run(self, fn: Callable[..., R], *args: Any) -> R:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def close(self) -> None:
        self._thread.shutdown(wait=True)
        self._readers.shutdown(wait=True)
        self.metadata.repo.close()


def health_before_made(root: Path) -> Health:
    """What a store not made yet at ``root`` reports: empty, on the disk of the nearest
    directory on the way that exists (where its first write will make it)."""
    where = root
    while not where.exists() and where != where.parent:
        where = where.parent
    return Health([_local(*disk_space(where))], 0, 0, 1)


def _local(free: int, total: int) -> NodeState:
    """An embedded store's one node: its directory, always there (no heartbeats)."""
    return NodeState(LOCAL_NODE, "", "local", free, total, time.time(), True)


class LocalChunks:
    """``ChunkTransport`` over the local chunk directory (the one node ``local``)."""

    def __init__(self, store: LocalChunkStore, threads: int) -> None:
        self.store = store
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="graben-io")
        # Hints get threads of their own: queued behind reads they arrive too
        # late, and one thread alone keeps too little I/O in flight.
        self._hints = ThreadPoolExecutor(HINT_THREADS, thread_name_prefix="graben-hint")
        # Small chunks written together share one sync (a checkpoint's record
        # headers: dozens of KiB-sized chunks, each else two fsyncs).
        self._small: Batcher[tuple[ChunkRef, memoryview], None] = Batcher(
            partial(self._run, LOCAL_NODE, self.store.write_group), max_size=256, concurrency=2
        )

    async def nodes(self) -> tuple[str, ...]:
        return (LOCAL_NODE,)

    @property
    def prefetch_window(self) -> int:
        return 16  # kernel read-ahead: costs no memory of ours

    @property
    def local_read(self) -> Callable[[str, ChunkRef, memoryview], None]:
        return self._read_now

    def _read_now(self, node: str, chunk: ChunkRef, into: memoryview) -> None:
        if node != LOCAL_NODE:
            raise Unavailable(f"an embedded store has no node {node!r}")
        self.store.read(chunk, into)

    async def _run(self, node: str, fn: Any, *args: Any, pool: Executor | None = None) -> Any:
        if node != LOCAL_NODE:
            raise Unavailable(f"an embedded store has no node {node!r}")
        return await in_thread(pool or self._pool, fn, *args)

    async def write(self, node: str, chunk: ChunkRef, data: memoryview) -> Receipt:
        # docstring inherited; the receipt is unsigned (an embedded store has no tenants):
        # its time alone counts, for a commit that races collection (``meta/_commits.py``)
        if node != LOCAL_NODE:
            raise Unavailable(f"an embedded store has no node {node!r}")
        started = time.time()
        if chunk.length <= GROUP_SYNC_MAX:
            await self._small.submit((chunk, data))
        else:
            await self._run(node, self.store.write, chunk, data)
        return Receipt(chunk.id, LOCAL_NODE, started + auth.RECEIPT_TTL_S, "")

    async def read(self, node: str, chunk: ChunkRef, into: memoryview) -> None:
        await self._run(node, self.store.read, chunk, into)

    async def prefetch(self, node: str, chunks: Sequence[ChunkRef]) -> int:
        # One hop to find what is not cached yet (warm reads stop there),
        # then the kernel reads those in parallel.
        cold: list[ChunkRef] = await self._run(node, self.store.uncached, chunks, pool=self._hints)
        await asyncio.gather(
            *(self._run(node, self.store.prefetch, c, pool=self._hints) for c in cold)
        )
        return len(cold)

    async def inventory(self, node: str, store: str, after: str = "") -> list[tuple[str, float]]:
        found: list[tuple[str, float]] = await self._run(
            node, self.store.inventory, after, page_entries()
        )
        return found

    async def temporaries(
        self, node: str, store: str, after: str = ""
    ) -> list[tuple[str, int, float]]:
        found: list[tuple[str, int, float]] = await self._run(
            node, self.store.temporaries, after, page_entries()
        )
        return found

    async def clean(self, node: str, store: str, older_than: float) -> tuple[int, int]:
        done: tuple[int, int] = await self._run(node, self.store.clean_temporaries, older_than)
        return done

    async def adoption(self, node: str, store: str, *, vouch: bool = False) -> bool:
        root = self.store.root.parent  # the store directory, where store-id is
        taken: bool = await self._run(node, partial(adoption, root, vouch=vouch))
        return taken

    async def delete(self, node: str, chunk_id: str, older_than: float) -> bool:
        gone: bool = await self._run(node, self.store.delete, chunk_id, older_than)
        return gone

    def describe(self, node: str, chunk_id: str) -> str:
        return str(self.store.path(chunk_id))

    def describe_temporary(self, node: str, name: str) -> str:
        return self.store.describe_temporary(name)

    async def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._hints.shutdown(wait=True)
        self.store.close()
