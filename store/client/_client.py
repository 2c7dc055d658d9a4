"""``Client``: the sync facade over ``AsyncClient``, on one background loop."""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future
from types import TracebackType
from typing import Any, Concatenate, Generic, Literal, ParamSpec, TypeVar, overload

from .._config import Options
from .._errors import InvalidArgument
from .._paths import normalize as normalize_path
from .._types import FileInfo
from ..transport import ChunkTransport, MetaTransport, Stat
from . import _loop
from ._aclient import AsyncClient
from ._afiles import check_mode, write_options
from ._files import ReadFile, WriteFile
from ._upload import Staging

T = TypeVar("T")
P = ParamSpec("P")


class Mirror(Generic[P, T]):
    """A ``Client`` method made from an ``AsyncClient`` coroutine method: the same
    parameters and docstring, run on the client's loop (as fsspec derives its sync
    methods from its async ones)."""

    def __init__(self, method: Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, T]]):
        self._method = method
        self.__name__, self.__doc__ = method.__name__, method.__doc__
        self.__signature__ = inspect.signature(method)
        """The unbound method's parameters, ``self`` first (``inspect.signature(Client.put)``)."""
        parameters = list(self.__signature__.parameters.values())
        self._bound = self.__signature__.replace(parameters=parameters[1:])

    @overload
    def __get__(self, client: None, owner: type[Client]) -> Mirror[P, T]: ...
    @overload
    def __get__(self, client: Client, owner: type[Client]) -> Callable[P, T]: ...

    def __get__(self, client: Client | None, owner: type[Client]) -> Mirror[P, T] | Callable[P, T]:
        if client is None:
            return self
        method = self._method

        def call(*args: P.args, **kwargs: P.kwargs) -> T:
            return _loop.run(method(client.aio, *args, **kwargs))

        call.__name__, call.__doc__ = self.__name__, self.__doc__
        call.__signature__ = self._bound  # type: ignore[attr-defined]
        return call

    def __call__(self, client: Client, *args: P.args, **kwargs: P.kwargs) -> T:
        """``Client.put(client, ...)``, as a plain method would allow."""
        return _loop.run(self._method(client.aio, *args, **kwargs))


class Client:
    """Sync access to one store: ``AsyncClient``'s methods, each waited for.

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
    def closed(self) -> bool:
        """Whether ``close`` was called."""
        return self._aio.closed

    @property
    def local(self) -> bool:
        """Whether the store runs in this process (embedded): its reads cost no hand-off."""
        return self.aio.local

    @property
    def chunk_size(self) -> int:
        """Bytes per chunk for new files."""
        return self.aio.chunk_size

    @classmethod
    def over(
        cls, meta: MetaTransport, chunks: ChunkTransport, options: Options, name: str = "custom"
    ) -> Client:
        """A client over given transports (the seam tests and the cluster use)."""
        return cls.wrap(AsyncClient.over(meta, chunks, options, name))

    def stat(self, path: str) -> FileInfo:
        """Attributes of a file or directory; ``NotFound`` if absent."""
        read = self.aio.meta.local_read
        if read is not None:  # an embedded store: in this thread, no loop hand-off
            info: FileInfo = read(Stat(normalize_path(path)))
            return info
        return _loop.run(self.aio.stat(path))

    @overload
    def open(
        self, path: str, mode: Literal["rb"] = "rb", *, autocommit: bool = True
    ) -> ReadFile: ...
    @overload
    def open(
        self, path: str, mode: Literal["wb", "xb"], *, autocommit: bool = True
    ) -> WriteFile: ...

    def open(
        self, path: str, mode: Literal["rb", "wb", "xb"] = "rb", *, autocommit: bool = True
    ) -> ReadFile | WriteFile:
        """A binary file object.

        ``rb``: the version committed at open time, seekable. ``wb``: a new
        version, visible atomically at ``close`` (with ``autocommit=False``, at
        ``commit``, or with others through ``commit_uploads``). ``xb``: like
        ``wb`` but fails with ``AlreadyExists`` if the path exists (at open and
        at commit).
        """
        check_mode(mode)
        aio = self.aio
        if mode == "rb":
            return ReadFile(_loop.run(aio._open_reader(path)), path)
        upload = _loop.run(aio._open_upload(path, write_options(mode)))
        return WriteFile(upload, Staging(aio.pool), autocommit=autocommit)

    # Every other method is AsyncClient's, run on the loop: written once, they cannot
    # drift (tests/store/client/test_sync_api.py checks the two classes match).
    close = Mirror(AsyncClient.close)
    exists = Mirror(AsyncClient.exists)
    ls = Mirror(AsyncClient.ls)
    mkdir = Mirror(AsyncClient.mkdir)
    rm = Mirror(AsyncClient.rm)
    remove_each = Mirror(AsyncClient.remove_each)
    rename = Mirror(AsyncClient.rename)
    publish = Mirror(AsyncClient.publish)
    health = Mirror(AsyncClient.health)
    drain_node = Mirror(AsyncClient.drain_node)
    remove_node = Mirror(AsyncClient.remove_node)
    du = Mirror(AsyncClient.du)
    set_class = Mirror(AsyncClient.set_class)
    storage_class = Mirror(AsyncClient.storage_class)
    quotas = Mirror(AsyncClient.quotas)
    set_quota = Mirror(AsyncClient.set_quota)
    add_tenant = Mirror(AsyncClient.add_tenant)
    tenants = Mirror(AsyncClient.tenants)
    issue_token = Mirror(AsyncClient.issue_token)
    tokens = Mirror(AsyncClient.tokens)
    whoami = Mirror(AsyncClient.whoami)
    revoke_tokens = Mirror(AsyncClient.revoke_tokens)
    changes = Mirror(AsyncClient.changes)
    put = Mirror(AsyncClient.put)
    put_parts = Mirror(AsyncClient.put_parts)
    put_parts_checked = Mirror(AsyncClient.put_parts_checked)
    stage_parts = Mirror(AsyncClient.stage_parts)
    commit_uploads = Mirror(AsyncClient.commit_uploads)
    finish_uploads = Mirror(AsyncClient.finish_uploads)
    get = Mirror(AsyncClient.get)
    get_range = Mirror(AsyncClient.get_range)
    layout = Mirror(AsyncClient.layout)
    set_attributes = Mirror(AsyncClient.set_attributes)
    set_attributes_each = Mirror(AsyncClient.set_attributes_each)
    link = Mirror(AsyncClient.link)
    mknod = Mirror(AsyncClient.mknod)
    copy = Mirror(AsyncClient.copy)
    fsck = Mirror(AsyncClient.fsck)


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

    An embedded store is made by the first write (``put``, ``mkdir``, a file
    opened for writing) where there is none yet (a missing path or an empty
    directory); until then reads raise ``NotFound`` naming the path, and
    nothing is made: a misspelt path is not a new, empty store
    (``mkdir("/", exist_ok=True)`` makes an empty one).
    """
    return Client(url, **options)
