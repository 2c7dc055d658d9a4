"""``Client``: the sync facade over ``AsyncClient``, on one background loop."""

from __future__ import annotations

import os
import threading
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import Literal, TypeVar, overload

from .._errors import InvalidArgument
from .._paths import normalize as normalize_path
from .._types import Buffer, Change, FileInfo, FsckReport, Health
from ..transport import Stat
from . import _loop
from ._aclient import AsyncClient, Progress
from ._afiles import check_mode
from ._files import ReadFile, WriteFile
from ._upload import Staging

T = TypeVar("T")


class Client:
    """Sync access to one store; every method mirrors ``AsyncClient``'s.

    Thread-safe: many threads may share one client.
    """

    def __init__(self, url: str | os.PathLike[str] | None = None, **options: object) -> None:
        self._how: tuple[str | os.PathLike[str] | None, dict[str, object]] | None = (url, options)
        self._aio, self._pid = _loop.run(_make(url, options)), os.getpid()
        self._lock = threading.Lock()

    @classmethod
    def wrap(cls, aio: AsyncClient) -> Client:
        """A sync facade over an existing async client (not usable in a forked child)."""
        client = cls.__new__(cls)
        client._how, client._aio, client._pid = None, aio, os.getpid()
        client._lock = threading.Lock()
        return client

    @property
    def aio(self) -> AsyncClient:
        """The ``AsyncClient`` underneath (to use from async code).

        In a forked child (a DataLoader worker), a new one on first use: the
        parent's connections and threads belong to the parent, and are left alone.
        """
        if self._pid != os.getpid():
            self._reopen()
        return self._aio

    def _reopen(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                return
            if self._how is None:
                raise InvalidArgument(
                    "a client made with Client.wrap cannot follow a fork: connect in the child"
                )
            _loop.abandon(self._aio)
            self._aio, self._pid = _loop.run(_make(*self._how)), os.getpid()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Client {self.aio.name}>"

    def close(self) -> None:
        """Release threads, buffers and connections."""
        _loop.run(self.aio.close())

    def submit(self, call: Callable[[AsyncClient], Awaitable[T]]) -> Future[T]:
        """Start ``call(self.aio)`` on the client's event loop and return at once.

        For callers with an event loop of their own (a trio FUSE daemon) that
        must not hold a thread while the store answers: the returned future is
        thread-safe; add a done-callback to wake the caller's loop.
        """
        aio = self.aio

        async def run() -> T:
            return await call(aio)

        return _loop.submit(run())

    @property
    def local(self) -> bool:
        """Whether the store runs in this process (embedded): its reads cost no hand-off."""
        return self.aio.meta.local_read is not None

    @property
    def chunk_size(self) -> int:
        """Bytes per chunk for new files."""
        return self.aio.options.chunk_size

    def stat(self, path: str) -> FileInfo:
        """Attributes of a file or directory; ``NotFound`` if absent."""
        read = self.aio.meta.local_read
        if read is not None:  # an embedded store: in this thread, no loop hand-off
            info: FileInfo = read(Stat(normalize_path(path)))
            return info
        return _loop.run(self.aio.stat(path))

    def exists(self, path: str) -> bool:
        """Whether ``path`` names a file or directory."""
        return _loop.run(self.aio.exists(path))

    def ls(self, path: str = "/") -> list[FileInfo]:
        """Entries of a directory sorted by name (a file lists as itself)."""
        return _loop.run(self.aio.ls(path))

    def mkdir(
        self,
        path: str,
        *,
        parents: bool = False,
        exist_ok: bool = False,
        mode: int | None = None,
        uid: int = -1,
        gid: int = -1,
    ) -> FileInfo:
        """Create a directory (``pathlib`` semantics; see ``AsyncClient.mkdir``)."""
        return _loop.run(
            self.aio.mkdir(path, parents=parents, exist_ok=exist_ok, mode=mode, uid=uid, gid=gid)
        )

    def rm(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file or empty directory; everything below it with ``recursive``."""
        _loop.run(self.aio.rm(path, recursive=recursive))

    def rename(
        self, src: str, dst: str, *, replace: bool = True, replace_tree: bool = False
    ) -> FileInfo:
        """Move atomically (``os.replace`` semantics; ``replace=False`` refuses to clobber;
        ``replace_tree`` replaces a non-empty directory in the same transaction)."""
        return _loop.run(self.aio.rename(src, dst, replace=replace, replace_tree=replace_tree))

    def health(self) -> Health:
        """Data nodes, and chunks short of copies (what ``graben status`` shows)."""
        return _loop.run(self.aio.health())

    def du(self, path: str = "/") -> tuple[int, int]:
        """(files, bytes) at or below ``path``."""
        return _loop.run(self.aio.du(path))

    def put(
        self,
        path: str,
        data: Buffer,
        *,
        exclusive: bool = False,
        replication: int | None = None,
        min_replicas: int | None = None,
        permissions: int | None = None,
        attributes: Change | None = None,
    ) -> FileInfo:
        """Store ``data`` at ``path`` in one commit, without copying it (``permissions``:
        mode bits; ``None`` keeps those of the file replaced; ``attributes``: an owner or
        a modification time too; ``min_replicas``: copies this write needs while nodes
        are down)."""
        return _loop.run(
            self.aio.put(
                path,
                data,
                exclusive=exclusive,
                replication=replication,
                min_replicas=min_replicas,
                permissions=permissions,
                attributes=attributes,
            )
        )

    def set_attributes(
        self,
        path: str,
        *,
        mode: int | None = None,
        mtime_ns: int | None = None,
        atime_ns: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
    ) -> FileInfo:
        """Change mode bits, times or owner in place (``chmod``, ``touch``, ``chown``)."""
        return _loop.run(
            self.aio.set_attributes(
                path, mode=mode, mtime_ns=mtime_ns, atime_ns=atime_ns, uid=uid, gid=gid
            )
        )

    def link(self, src: str, dst: str) -> FileInfo:
        """Give the file at ``src`` another name (a hard link; see ``AsyncClient.link``)."""
        return _loop.run(self.aio.link(src, dst))

    def mknod(
        self, path: str, mode: int, *, rdev: int = 0, uid: int | None = None, gid: int | None = None
    ) -> FileInfo:
        """Make a fifo, socket or device node (see ``AsyncClient.mknod``)."""
        return _loop.run(self.aio.mknod(path, mode, rdev=rdev, uid=uid, gid=gid))

    def copy(self, src: str, dst: str, *, exclusive: bool = False) -> FileInfo:
        """A new file at ``dst`` sharing ``src``'s chunks: metadata only, whatever the size."""
        return _loop.run(self.aio.copy(src, dst, exclusive=exclusive))

    def put_parts(
        self,
        path: str,
        parts: Sequence[Buffer],
        *,
        exclusive: bool = False,
        replication: int | None = None,
        min_replicas: int | None = None,
    ) -> FileInfo:
        """Store the concatenation of ``parts``; large parts go without a copy and
        dedup as units (see ``AsyncClient.put_parts``)."""
        run = self.aio.put_parts(
            path, parts, exclusive=exclusive, replication=replication, min_replicas=min_replicas
        )
        return _loop.run(run)

    def put_parts_checked(
        self,
        path: str,
        parts: Sequence[Buffer],
        *,
        exclusive: bool = False,
        replication: int | None = None,
        min_replicas: int | None = None,
    ) -> tuple[FileInfo, list[int]]:
        """``put_parts``, and each part's crc32c (a large part's from its chunks' own)."""
        run = self.aio.put_parts_checked(
            path, parts, exclusive=exclusive, replication=replication, min_replicas=min_replicas
        )
        return _loop.run(run)

    def get(self, path: str) -> bytes:
        """A file's whole content."""
        return _loop.run(self.aio.get(path))

    def get_range(self, path: str, start: int, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of a file, cut at its end."""
        return _loop.run(self.aio.get_range(path, start, end))

    @overload
    def open(self, path: str, mode: Literal["rb"] = "rb") -> ReadFile: ...
    @overload
    def open(self, path: str, mode: Literal["wb", "xb"]) -> WriteFile: ...

    def open(self, path: str, mode: Literal["rb", "wb", "xb"] = "rb") -> ReadFile | WriteFile:
        """A binary file object.

        ``rb``: the version committed at open time, seekable. ``wb``: a new
        version, visible atomically at ``close``. ``xb``: like ``wb`` but fails
        with ``AlreadyExists`` if the path exists (at open and at close).
        """
        check_mode(mode)
        if mode == "rb":
            return ReadFile(_loop.run(self.aio.reader(path)), path)
        upload = _loop.run(self.aio.upload(path, "create" if mode == "xb" else "overwrite"))
        return WriteFile(upload, Staging(self.aio.pool))

    def fsck(
        self,
        *,
        collect: bool = False,
        grace: float | None = None,
        force: bool = False,
        progress: Progress | None = None,
    ) -> FsckReport:
        """Re-read and verify every chunk copy and the metadata; report what is missing,
        corrupt, inconsistent or left over (see ``AsyncClient.fsck``)."""
        run = self.aio.fsck(collect=collect, grace=grace, force=force, progress=progress)
        return _loop.run(run)


async def _make(url: str | os.PathLike[str] | None, options: dict[str, object]) -> AsyncClient:
    return AsyncClient(url, **options)


def connect(url: str | os.PathLike[str] | None = None, **options: object) -> Client:
    """Open a store.

    ``url``: ``None`` for ``$GRABEN_URL`` or else the embedded store at
    ``$GRABEN_HOME`` (default ``~/.local/share/graben``); a directory or
    ``file:///dir`` for an embedded store there; ``graben://host:port`` for a
    cluster, ``graben://h1:7100,h2:7100`` for one with several metadata
    services (a name with several addresses counts as several): the client
    uses one and moves to the next when it stops answering. ``options`` are
    the fields of ``graben.store.Options``.
    """
    return Client(url, **options)
