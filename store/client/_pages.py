"""Whole listings and layouts, gathered page by page from the metadata service.

No reply carries more than a page (``ListDir``, ``GetLayout``), so a
directory of a million entries or a file of a million chunks never meets a
frame limit. A listing's later pages follow the directory's inode; a
layout's follow the file version's inode, and if that version is replaced
between pages the layout is gathered again from the start, so a reader
always gets one whole version. A gathered layout is checked before anyone
reads by it: its extents must tile the file, so a damaged engine row is a
loud ``IntegrityError``, not a short or wrong read.
"""

from __future__ import annotations

from typing import TypeVar

from .._errors import IntegrityError, NotFound
from .._types import Capability, Extent, FileInfo, FileLayout
from ..transport import LAYOUT_PAGE, LIST_PAGE, GetLayout, ListDir, MetaTransport, Request

R = TypeVar("R")

RESTARTS = 5
"""Times a layout is gathered again because its file was replaced meanwhile."""


async def _read(meta: MetaTransport, request: Request[R]) -> R:
    """``request`` answered: an embedded store's in this thread (one indexed SQLite read
    costs less than handing it to a reader thread and back: a mount's ``open`` of a small
    file 290 -> 172 us), a service's over the wire."""
    read = meta.local_read
    if read is not None:
        answer: R = read(request)
        return answer
    return await meta.request(request)


async def listing(meta: MetaTransport, path: str) -> list[FileInfo]:
    """Every entry of a directory (a file lists as itself), sorted by name."""
    page = await _read(meta, ListDir(path, limit=LIST_PAGE))
    entries = list(page.entries)
    while page.more and entries:
        request = ListDir(path, entries[-1].name, LIST_PAGE, page.directory)
        page = await _read(meta, request)
        entries.extend(page.entries)
    return entries


async def layout(meta: MetaTransport, path: str) -> FileLayout:
    """A file's whole layout, of one version, checked."""
    for _ in range(RESTARTS):
        first = await _read(meta, GetLayout(path, limit=LAYOUT_PAGE))
        try:
            whole = await _rest(meta, path, first)
        except NotFound:
            continue  # replaced between pages: take the new version
        _check_tiles(whole)
        return whole
    raise IntegrityError(f"the file changed {RESTARTS} times while being opened", path)


async def page_at(meta: MetaTransport, path: str, inode: int, offset: int) -> FileLayout:
    """The page of version ``inode``'s layout from ``offset`` (``NotFound`` once that
    version is gone): where its chunks are now."""
    return await meta.request(GetLayout(path, offset, LAYOUT_PAGE, inode))


async def _rest(meta: MetaTransport, path: str, first: FileLayout) -> FileLayout:
    if not first.more:
        return first
    extents: list[Extent] = list(first.extents)
    replicas = dict(first.replicas)
    grants: dict[str, Capability] = dict(first.grants)
    inline, stripes = dict(first.inline), dict(first.stripes)
    page = first
    while page.more and page.extents:
        end = page.extents[-1].offset + page.extents[-1].length
        page = await meta.request(GetLayout(path, end, LAYOUT_PAGE, first.info.inode))
        extents.extend(x for x in page.extents if x.offset >= end)
        replicas.update(page.replicas)
        grants.update(page.grants)
        inline.update(page.inline)
        stripes.update(page.stripes)
    return FileLayout(first.info, tuple(extents), replicas, grants, inline=inline, stripes=stripes)


def _check_tiles(layout: FileLayout) -> None:
    """The extents must cover the file from 0 to its size, each inside its chunk."""
    at = 0
    for extent in layout.extents:
        inside = (
            extent.chunk_offset >= 0 and extent.chunk_offset + extent.length <= extent.chunk.length
        )
        if extent.offset != at or extent.length <= 0 or not inside:
            raise IntegrityError(
                f"the metadata of this file is damaged: its extents do not tile it at offset {at}",
                layout.info.path,
            )
        at += extent.length
    if at != layout.info.size:
        raise IntegrityError(
            f"the metadata of this file is damaged: its extents cover {at} bytes, "
            f"not its size of {layout.info.size}",
            layout.info.path,
        )
