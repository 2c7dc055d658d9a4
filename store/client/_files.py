"""Sync file objects: what ``Client.open`` returns.

Readers are ``io.BufferedReader`` over a raw reader, so small reads are served
from a local buffer and large ones go straight into the caller's memory.
Writers copy into pooled chunk buffers in the caller's thread and hand full
chunks to the background loop, which uploads them while the caller goes on.
"""

from __future__ import annotations

import io
import os
import warnings
from types import TracebackType

from .._errors import InvalidArgument
from .._types import Buffer, FileInfo
from . import _loop
from ._afiles import seek_position, sequential_seek
from ._reader import Reader
from ._upload import Staging, Upload

READ_BUFFER = 256 * 1024


class RawReadFile(io.RawIOBase):
    """Unbuffered reads of one committed file version."""

    def __init__(self, reader: Reader, path: str) -> None:
        super().__init__()
        self._reader, self.name, self._pos = reader, path, 0
        self.info = reader.layout.info
        self.mode = "rb"

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Buffer) -> int:  # type: ignore[override]
        with memoryview(buffer).cast("B") as view:
            n = self._reader.read_here(self._pos, view)
            if n is None:
                n = _loop.run(self._reader.readinto(self._pos, view))
        self._pos += n
        return n

    def readall(self) -> bytes:
        data = _loop.run(self._reader.read(self._pos, self._reader.size - self._pos))
        self._pos += len(data)
        return data

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._pos = seek_position(self._pos, self._reader.size, offset, whence)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        if not self.closed and _loop.alive():
            _loop.run(self._reader.close())
        super().close()


class ReadFile(io.BufferedReader):
    """A committed file version opened for reading: a buffered binary file."""

    def __init__(self, reader: Reader, path: str) -> None:
        super().__init__(RawReadFile(reader, path), buffer_size=READ_BUFFER)
        self.info: FileInfo = reader.layout.info
        """The attributes of the version being read."""


class WriteFile(io.BufferedIOBase):
    """A new file version: visible at ``close``; an exception in a ``with`` block discards it.

    Opened with ``autocommit=False``, ``close`` only uploads: ``commit`` publishes it,
    or ``Client.commit_uploads`` publishes several files' ``upload`` at once. A
    writer that is garbage-collected without ``close`` is discarded (with a
    ``ResourceWarning``): nothing half-written ever becomes visible.
    """

    def __init__(self, upload: Upload, staging: Staging, *, autocommit: bool = True) -> None:
        super().__init__()
        self.upload, self._staging, self._autocommit = upload, staging, autocommit
        self.name = upload.path
        self.mode = "wb"
        self.info: FileInfo | None = None
        """The committed version's attributes (``None`` until committed)."""
        self._pos = 0
        self._done = False

    def writable(self) -> bool:
        """Always true: the file is open for writing."""
        return True

    def write(self, data: Buffer) -> int:  # type: ignore[override]
        """Stage ``data`` (copied into chunk buffers here); full chunks start uploading."""
        if self._done:
            raise InvalidArgument("write to a closed file", self.name)
        for chunk, release in self._staging.feed(data):
            _loop.run(self.upload.add(chunk, release))
        size = memoryview(data).nbytes
        self._pos += size
        return size

    def tell(self) -> int:
        """Bytes written so far."""
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        """Only to where the file is: graben write files are sequential."""
        return sequential_seek(self._pos, offset, whence)

    def flush(self) -> None:
        """Nothing to do: bytes become durable and visible at ``close``."""

    def close(self) -> None:
        """Upload what is staged and commit; the new version is visible on return
        (opened with ``autocommit=False``: only uploaded, not yet visible)."""
        if self._done:
            super().close()
            return
        self._done = True
        try:
            detached = self._staging.detach()
            if detached is not None:
                _loop.run(self.upload.add(*detached))
            if self._autocommit:
                self.info = _loop.run(self.upload.commit())
            else:
                _loop.run(self.upload.finish())  # upload errors surface here, not later
        except BaseException:
            self._drop()
            raise
        finally:
            super().close()

    def commit(self) -> FileInfo:
        """Publish a file opened with ``autocommit=False`` (closing it first)."""
        self.close()
        if self.info is None:
            self.info = _loop.run(self.upload.commit())
        return self.info

    def discard(self) -> None:
        """Drop the file, open or closed but not committed: nothing becomes visible."""
        if self.info is None:
            self._done = True
            self._drop()
        super().close()

    def abort(self) -> None:
        """Discard an open file: nothing becomes visible."""
        if not self._done:
            self._done = True
            self._drop()
        super().close()

    def _drop(self) -> None:
        self._staging.discard()
        _loop.run(self.upload.abort())

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.close()
        else:
            self.abort()

    def __del__(self) -> None:
        if self._done:
            return
        warnings.warn(
            f"graben file {self.name!r} was never closed; discarded", ResourceWarning, stacklevel=2
        )
        if _loop.alive():
            self.abort()
        else:  # exiting: nothing is committed either way; just let go
            self._done = True
            self._staging.discard()
