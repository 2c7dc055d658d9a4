"""The spool: local files holding what open files wrote and have not committed yet.

The store's files are immutable once committed, while POSIX files take writes
anywhere, at any time. So a file opened for writing is staged whole in a spool
file on local disk (its old content copied in first unless it is truncated),
takes reads and writes there, and is committed to the store, in one put,
when it is closed or fsynced (see ``_handles``). The spool has a byte limit: a
write that would take it over fails with ``ENOSPC`` and changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import io
import logging
import mmap
import os
import secrets
import traceback
from collections.abc import AsyncIterator, Iterator

from graben.store import IntegrityError, NoSpace

log = logging.getLogger("graben.fuse")
COPY_BLOCK = 8 << 20
"""Bytes copied at a time when a file's committed content is spooled."""
PROT_RW = mmap.PROT_READ | mmap.PROT_WRITE
TURNS = 4
"""Turns of the loop a failed put's own tasks take to end (``mapped_for_put``)."""


class Spool:
    """A directory of spool files, and the bytes they may hold together."""

    def __init__(self, directory: int, limit: int) -> None:
        """``directory``: an open descriptor of it (checked private; the spool closes it)."""
        self.directory, self.limit = directory, limit
        self.used = 0

    def new(self) -> SpoolFile:
        """An empty spool file, with no name: nothing is left behind if we die."""
        try:
            fd = os.open(".", os.O_TMPFILE | os.O_RDWR, 0o600, dir_fd=self.directory)
        except OSError as exc:  # a filesystem without O_TMPFILE: a new name, unlinked at once
            if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
            name = f"spool-{secrets.token_hex(8)}"
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            fd = os.open(name, flags, 0o600, dir_fd=self.directory)
            os.unlink(name, dir_fd=self.directory)
        return SpoolFile(self, fd)

    def close(self) -> None:
        """Let go of the directory."""
        if self.directory >= 0:
            os.close(self.directory)
            self.directory = -1

    def _grow(self, old: int, new: int) -> None:
        if new > old and self.used + new - old > self.limit:
            raise NoSpace(f"the mount's spool is full ({self.limit} bytes)")
        self.used += new - old


class SpoolFile:
    """One open file's uncommitted content."""

    def __init__(self, spool: Spool, fd: int) -> None:
        self._spool, self.fd = spool, fd
        self.size = 0
        self.dirty = False
        """Written since the last commit."""

    def write(self, offset: int, data: bytes) -> int:
        """Write ``data`` at ``offset`` (past the end leaves a hole of zeros)."""
        end = max(self.size, offset + len(data))
        self._spool._grow(self.size, end)
        try:
            written = os.pwrite(self.fd, data, offset)
        except OSError:
            self._spool._grow(end, self.size)
            raise
        self._spool._grow(end, max(self.size, offset + written))
        self.size, self.dirty = max(self.size, offset + written), True
        return written

    def read(self, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes from ``offset``."""
        return os.pread(self.fd, min(size, max(0, self.size - offset)), offset)

    def truncate(self, size: int) -> None:
        """Cut or extend (with zeros) to ``size`` bytes."""
        self._spool._grow(self.size, size)
        os.ftruncate(self.fd, size)
        self.size, self.dirty = size, True

    def fill(self, source: io.BufferedIOBase, size: int) -> None:
        """Copy a committed version in (blocking: run it off the event loop)."""
        self._spool._grow(self.size, size)
        os.ftruncate(self.fd, size)
        self.size = size
        with self.mapped() as view:
            done = 0
            while done < size:
                n = source.readinto(view[done : done + COPY_BLOCK])
                if not n:
                    raise IntegrityError("the file changed length while it was spooled")
                done += n

    @contextlib.contextmanager
    def mapped(self) -> Iterator[memoryview]:
        """The content as one memoryview, without copying it."""
        if self.size == 0:
            yield memoryview(b"")
            return
        with mapping(self.fd, self.size) as view:
            yield view

    @contextlib.asynccontextmanager
    async def mapped_for_put(self) -> AsyncIterator[memoryview]:
        """``mapped`` for a put awaited on this loop. A put that fails leaves tasks of its
        own ending on this loop: their done callbacks, run at its next turns, hold the
        error, whose frames hold slices of the view. Those turns come before the
        mapping is closed."""
        with self.mapped() as view:
            try:
                yield view
            except BaseException:
                for _ in range(TURNS):
                    await asyncio.sleep(0)
                raise

    def close(self) -> None:
        """Drop the content and give its bytes back to the spool."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            self._spool._grow(self.size, 0)


@contextlib.contextmanager
def mapping(fd: int, length: int, offset: int = 0, prot: int = PROT_RW) -> Iterator[memoryview]:
    """``length`` bytes of the file ``fd`` from ``offset`` as a view, unmapped after the
    block even when what the view was given to failed (``drop_frames``, ``_unmap``)."""
    region = mmap.mmap(fd, length, prot=prot, offset=offset)
    view = memoryview(region)
    try:
        yield view
    except BaseException as exc:
        drop_frames(exc)
        raise
    finally:
        view.release()
        _unmap(region)


def _unmap(region: mmap.mmap) -> None:
    """Close a spool file's mapping once its put is done.

    A put that failed leaves its slices of the view in reference cycles (an
    error's traceback holds the frames that hold the slices; the upload, or a
    future in those frames, holds the error) until the garbage collector runs:
    run it then, on that failure path only.
    """
    try:
        region.close()
        return
    except BufferError:
        gc.collect()
    try:
        region.close()
    except BufferError:
        # A bug: whoever was given the view still holds a slice of it. The put
        # is done, so the commit stands (an EIO here would tell the writer a
        # committed file failed); the mapping goes with the slice. Logged so that
        # tests see it.
        log.error("a view of a spool file outlived its put (mapping left open)")


def drop_frames(exc: BaseException) -> None:
    """Clear the locals of the frames ``exc`` (and the errors it arose from) went
    through: a put that failed left slices of the view it was given there, and the
    mapping under them cannot be closed while they live (its error reaches the writer
    all the same, with its traceback's lines)."""
    seen: set[int] = set()
    found: BaseException | None = exc
    while found is not None and id(found) not in seen:
        seen.add(id(found))
        traceback.clear_frames(found.__traceback__)
        found = found.__cause__ or found.__context__
