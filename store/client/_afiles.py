"""Async file objects: ``AsyncClient.open`` returns these.

The opener asks its client only for a ``Reader``, an ``Upload`` and buffers
(``Opens``), so this module needs nothing of ``_aclient``, which imports it.
"""

from __future__ import annotations

import io
import os
from collections.abc import Generator
from types import TracebackType
from typing import Any, Protocol

from .._buffers import BufferPool
from .._errors import InvalidArgument
from .._types import Buffer, FileInfo
from ._reader import Reader
from ._upload import Staging, Upload, WriteOptions

MODES = ("rb", "wb", "xb")


def write_options(mode: str) -> WriteOptions:
    """How a file opened ``wb`` or ``xb`` is written (``xb``: ``exclusive``)."""
    return WriteOptions(exclusive=mode == "xb")


def check_mode(mode: str) -> None:
    """Refuse modes graben files do not have."""
    if mode not in MODES:
        raise InvalidArgument(
            f"unsupported mode {mode!r}: graben files are binary and immutable once "
            "committed; use 'rb', 'wb' (replace on close) or 'xb' (create on close)"
        )


class AsyncReadFile:
    """A committed file version, read with ``await f.read()``, ``readinto``, ``seek``."""

    def __init__(self, reader: Reader, path: str) -> None:
        self._reader, self.name, self._pos = reader, path, 0
        self.info = reader.layout.info
        self.closed = False

    async def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (all that is left if negative)."""
        left = self._reader.size - self._pos
        data = await self._reader.read(self._pos, left if size < 0 else min(size, left))
        self._pos += len(data)
        return data

    async def readinto(self, buffer: Buffer) -> int:
        """Fill ``buffer`` from the current position; returns bytes read."""
        with memoryview(buffer).cast("B") as view:
            n = await self._reader.readinto(self._pos, view)
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        """Move the position (``io`` semantics)."""
        self._pos = seek_position(self._pos, self._reader.size, offset, whence)
        return self._pos

    def tell(self) -> int:
        """The current position."""
        return self._pos

    async def close(self) -> None:
        """Release cached chunks."""
        if not self.closed:
            self.closed = True
            await self._reader.close()

    async def __aenter__(self) -> AsyncReadFile:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncWriteFile:
    """A new file version: visible at ``close``; an exception in an ``async with`` block
    discards it (the sync ``WriteFile``'s methods, awaited).

    Opened with ``autocommit=False``, ``close`` only uploads: ``commit`` publishes it,
    or ``AsyncClient.commit_uploads`` publishes several files' ``upload`` at once.
    """

    def __init__(self, upload: Upload, staging: Staging, *, autocommit: bool = True) -> None:
        self.upload, self._staging, self._autocommit = upload, staging, autocommit
        self.name = upload.path
        self.mode = "wb"
        self.info: FileInfo | None = None
        """The committed version's attributes (``None`` until committed)."""
        self.closed = False
        self._pos = 0

    def writable(self) -> bool:
        """Always true: the file is open for writing."""
        return True

    async def write(self, data: Buffer) -> int:
        """Stage ``data``; full chunks start uploading at once."""
        if self.closed:
            raise InvalidArgument("write to a closed file", self.name)
        for chunk, release in self._staging.feed(data):
            await self.upload.add(chunk, release)
        size = memoryview(data).nbytes
        self._pos += size
        return size

    def tell(self) -> int:
        """Bytes written so far."""
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        """Only to where the file is: graben write files are sequential."""
        return sequential_seek(self._pos, offset, whence)

    async def flush(self) -> None:
        """Nothing to do: bytes become durable and visible at ``close``."""

    async def close(self) -> FileInfo | None:
        """Upload what is staged and commit; returns the new version's attributes
        (``None`` opened with ``autocommit=False``: only uploaded, not yet visible)."""
        if self.closed:
            return self.info
        self.closed = True
        try:
            detached = self._staging.detach()
            if detached is not None:
                await self.upload.add(*detached)
            if self._autocommit:
                self.info = await self.upload.commit()
            else:
                await self.upload.finish()  # upload errors surface here, not later
        except BaseException:
            await self._drop()
            raise
        return self.info

    async def commit(self) -> FileInfo:
        """Publish a file opened with ``autocommit=False`` (closing it first)."""
        await self.close()
        if self.info is None:
            self.info = await self.upload.commit()
        return self.info

    async def discard(self) -> None:
        """Drop the file, open or closed but not committed: nothing becomes visible."""
        if self.info is None:
            self.closed = True
            await self._drop()

    async def abort(self) -> None:
        """Discard an open file: nothing becomes visible."""
        if not self.closed:
            self.closed = True
            await self._drop()

    async def _drop(self) -> None:
        self._staging.discard()
        await self.upload.abort()

    async def __aenter__(self) -> AsyncWriteFile:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            await self.close()
        else:
            await self.abort()


def sequential_seek(pos: int, offset: int, whence: int) -> int:
    """``seek`` on a write file: anywhere but where it is is refused."""
    if seek_position(pos, pos, offset, whence) != pos:
        raise io.UnsupportedOperation("graben write files are sequential")
    return pos


def seek_position(pos: int, size: int, offset: int, whence: int) -> int:
    """The new position for ``seek`` (shared by the sync and async readers)."""
    if whence == os.SEEK_SET:
        new = offset
    elif whence == os.SEEK_CUR:
        new = pos + offset
    elif whence == os.SEEK_END:
        new = size + offset
    else:
        raise InvalidArgument(f"invalid whence {whence}")
    if new < 0:
        raise InvalidArgument(f"negative seek position {new}")
    return new


class Opens(Protocol):
    """What an opener needs of its client (``AsyncClient`` is one)."""

    pool: BufferPool
    """Chunk buffers for a writer's staging."""

    async def _open_reader(self, path: str) -> Reader:
        """A reader of the file's current version."""

    async def _open_upload(self, path: str, write: WriteOptions = ...) -> Upload:
        """An upload that commits a new version at ``path``."""


class AsyncFileOpener:
    """What ``AsyncClient.open`` returns: awaitable, and an async context manager."""

    def __init__(self, client: Opens, path: str, mode: str, autocommit: bool) -> None:
        check_mode(mode)
        self._client, self._path, self._mode = client, path, mode
        self._autocommit = autocommit
        self._file: AsyncReadFile | AsyncWriteFile | None = None

    async def _open(self) -> AsyncReadFile | AsyncWriteFile:
        if self._mode == "rb":
            return AsyncReadFile(await self._client._open_reader(self._path), self._path)
        upload = await self._client._open_upload(self._path, write_options(self._mode))
        return AsyncWriteFile(upload, Staging(self._client.pool), autocommit=self._autocommit)

    def __await__(self) -> Generator[Any, None, AsyncReadFile | AsyncWriteFile]:
        return self._open().__await__()

    async def __aenter__(self) -> Any:
        self._file = await self._open()
        return self._file

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._file is not None
        await self._file.__aexit__(kind, exc, tb)
