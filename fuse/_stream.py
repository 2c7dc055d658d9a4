"""Upload while the application writes: a new file written front to back.

Staging a file whole and uploading it at close costs the upload's time again
after the last write. Most big files (``torch.save``, ``cp``, ``dd``) are
written front to back into a new or truncated file, so their bytes can go to
the store while later ones are still arriving: each time a chunk's worth more
is in the spool, a worker thread feeds it to a store ``WriteFile``; the close
only sends the tail and commits. The spool still takes every byte, so a
writer that seeks back, truncates or fails simply drops the stream, and the
file is committed from the spool as usual.
"""

from __future__ import annotations

import asyncio
import mmap

from graben.store import Client, FileInfo, WriteFile

from ._aio import Tasks, in_thread
from ._spool import SpoolFile, mapping


class Stream:
    """A store upload following one spool file's sequential writes."""

    def __init__(self, client: Client, path: str, step: int) -> None:
        self._client, self._path, self._step = client, path, step
        self._file: WriteFile | None = None
        self.sent = 0
        """Bytes of the spool fed to the upload."""
        self._idle = asyncio.Event()
        self._idle.set()
        self.failed: BaseException | None = None

    def follows(self, offset: int, spool: SpoolFile) -> bool:
        """Whether a write at ``offset`` keeps the file sequential."""
        return self.failed is None and offset == spool.size

    def advance(self, spool: SpoolFile, nursery: Tasks) -> None:
        """Feed whole steps written since the last feed, in the background."""
        upto = spool.size - spool.size % self._step
        if self._idle.is_set() and upto > self.sent and self.failed is None:
            self._idle = asyncio.Event()
            nursery.start_soon(self._feed, spool, upto)

    async def finish(self, spool: SpoolFile) -> FileInfo | None:
        """Send the rest and commit; what was committed, or ``None`` if the stream failed or
        never started (a file under one chunk: one ``put`` of the spool costs fewer round
        trips)."""
        await self._idle.wait()
        if self.failed is None and self._file is not None:
            try:
                await in_thread(self._send, spool, spool.size)
                return await in_thread(self._file.commit)
            except Exception as exc:
                self.failed = exc
        await self.abandon()
        return None

    async def abandon(self) -> None:
        """Drop the upload: nothing of it becomes visible."""
        await self._idle.wait()
        if self._file is not None:
            file, self._file = self._file, None
            await in_thread(file.abort)

    async def _feed(self, spool: SpoolFile, upto: int) -> None:
        try:
            await in_thread(self._send, spool, upto)
        except Exception as exc:  # the commit falls back to the spool
            self.failed = exc
        finally:
            self._idle.set()

    def _open(self) -> WriteFile:
        return self._client.open(self._path, "wb")

    def _send(self, spool: SpoolFile, upto: int) -> None:
        if upto <= self.sent:
            return
        if self._file is None:
            self._file = self._open()
        # ``sent`` is a whole number of steps, so a valid mapping offset.
        with mapping(spool.fd, upto - self.sent, self.sent, mmap.PROT_READ) as view:
            self._file.write(view)
        self.sent = upto
