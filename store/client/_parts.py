"""Many parts of one file, and many files of one commit.

``stage_parts`` feeds an ``Upload`` the parts of ``AsyncClient.put_parts``
and its kin: a part of ``DIRECT_PART`` bytes or more becomes chunks of its
own, uncopied (so an unchanged tensor in the next checkpoint dedups); smaller
parts are packed together into pooled chunk buffers. Each part's crc32c
comes back with it, a large part's combined from its chunks' own.
``finished`` gathers several finished uploads into one commit's files, and
``inline_batches`` cuts many files into commits of modest size.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from .._buffers import BufferPool
from .._hashing import crc32c, crc32c_combine
from .._types import Buffer, Extent, FileCommit
from ._upload import Release, Staging, Upload

DIRECT_PART = 64 * 1024
"""``put_parts`` uploads parts this large from the caller's memory; smaller ones are packed."""
COMMIT_INLINE_MAX = 8 << 20
"""Bytes for the engine to keep that one commit of several files carries at most (the rest
go to the nodes): a commit stays one modest frame and one modest transaction."""


async def stage_parts(
    upload: Upload, parts: Sequence[Buffer], pool: BufferPool, chunk_size: int
) -> list[int]:
    """Add ``parts`` to ``upload`` in order and finish it (nothing committed); each part's
    crc32c. On failure the upload is aborted."""
    staging = Staging(pool)
    added = 0
    spans: list[tuple[int, int] | int] = []  # a direct part's chunks, or a packed one's crc32c

    async def add(chunk: memoryview, release: Release | None = None) -> None:
        nonlocal added
        await upload.add(chunk, release)
        added += 1

    async def send_packed() -> None:
        detached = staging.detach()
        if detached is not None:
            await add(*detached)

    try:
        for part in parts:
            view = memoryview(part).cast("B")
            if view.nbytes < DIRECT_PART and len(parts) > 1:
                spans.append(crc32c(view))
                for chunk, release in staging.feed(view):
                    await add(chunk, release)
                continue
            await send_packed()  # what is packed so far ends before this part
            first = added
            for start in range(0, view.nbytes, chunk_size):
                await add(view[start : start + chunk_size])
            spans.append((first, added))
        await send_packed()
    except BaseException:
        staging.discard()
        await upload.abort()
        raise
    extents = (await upload.finish()).extents  # what commit sends: kept, not made twice
    return [_part_crc(span, extents) for span in spans]


async def finished(uploads: Sequence[Upload]) -> list[FileCommit]:
    """What one commit of ``uploads`` sends, each waited for; the first failure raised.
    Past ``COMMIT_INLINE_MAX`` bytes kept inline, the rest of the small files go to the
    nodes."""
    budget = COMMIT_INLINE_MAX
    for upload in uploads:
        budget -= upload.inline_bytes
        if budget < 0:
            await upload.spill()
    done = await asyncio.gather(*(u.finish() for u in uploads), return_exceptions=True)
    commits = []
    for outcome in done:
        if isinstance(outcome, BaseException):
            raise outcome
        commits.append(outcome)
    return commits


def inline_batches(files: Sequence[FileCommit]) -> list[list[FileCommit]]:
    """``files`` in order, cut so that no batch carries more than ``COMMIT_INLINE_MAX``
    bytes for the engine to keep (a file carrying more is a batch alone); at least one
    batch, maybe empty."""
    batches: list[list[FileCommit]] = [[]]
    budget = COMMIT_INLINE_MAX
    for file in files:
        carried = sum(len(s.data) for s in file.stored if s.data is not None)
        if carried > budget and batches[-1]:
            batches.append([])
            budget = COMMIT_INLINE_MAX
        batches[-1].append(file)
        budget -= carried
    return batches


def _part_crc(span: tuple[int, int] | int, extents: Sequence[Extent]) -> int:
    """A part's crc32c: computed already (packed), or combined from its chunks' (direct)."""
    if isinstance(span, int):
        return span
    value = 0
    for extent in extents[span[0] : span[1]]:
        value = crc32c_combine(value, extent.chunk.crc32c, extent.length)
    return value
