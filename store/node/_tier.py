"""A data node's read-through of the S3 tier, with its cache in front.

A chunk of class ``s3`` has no copy on any node: the metadata service names
two nodes to read it from (the same two for a chunk while they live). A node
asked for a chunk it does not hold looks in its cache (``ROOT/cache``, chunk
files as in ``ROOT/chunks``, not fsynced: a cache), else fetches the object
once however many readers ask at the same time, checks it (length, crc32c,
blake3 against the id), keeps it in the cache and serves it from there as it
serves its own chunks (``sendfile``). The cache keeps at most ``limit`` bytes:
past that, the chunks read longest ago go.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from .._types import ChunkRef
from ..tier import Bucket
from ._chunkstore import LocalChunkStore
from ._sealed import Sealer

Run = Callable[..., Awaitable[Any]]
TOUCH_S = 60.0
"""A cached chunk's time is moved on a read at most this often (a write to its inode)."""


class Tier:
    """The S3 tier as one node reads it: the bucket, and the cache in front of it."""

    def __init__(
        self, bucket: Bucket, root: Path, limit: int, run: Run, sealer: Sealer | None = None
    ) -> None:
        self.bucket, self.limit, self._run = bucket, limit, run
        self.cache = LocalChunkStore(root, sealer=sealer)  # sealed as the node's own
        self._fetching: dict[str, asyncio.Future[None]] = {}
        self._held = sum(size for _, size, _ in self.cache.files())
        """Bytes in the cache now (counted at start, then kept up to date)."""

    def close(self) -> None:
        self.cache.close()

    async def local(self, chunk: ChunkRef) -> LocalChunkStore:
        """The store holding ``chunk`` here: the cache, fetched into it if need be."""
        path = self.cache.path(chunk.id)
        try:
            touched = path.stat().st_mtime
        except FileNotFoundError:
            pass
        else:
            if time.time() - touched > TOUCH_S:  # read lately: among the last to go
                os.utime(path)
            return self.cache
        waiting = self._fetching.get(chunk.id)
        if waiting is None:
            waiting = asyncio.ensure_future(self._fetch(chunk))
            self._fetching[chunk.id] = waiting
            waiting.add_done_callback(lambda _: self._fetching.pop(chunk.id, None))
        await asyncio.shield(waiting)
        return self.cache

    async def _fetch(self, chunk: ChunkRef) -> None:
        data = await self.bucket.get(chunk)
        await self._run(self.cache.keep, chunk, memoryview(data))
        self._held += chunk.length
        if self._held > self.limit:
            self._held -= await self._run(self.cache.evict, self._held - self.limit)
