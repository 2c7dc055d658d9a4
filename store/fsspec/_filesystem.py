"""``graben://`` for fsspec: ``GrabenFileSystem``.

``graben://host:port/a/b`` names ``/a/b`` on that cluster; ``graben:///a/b``
names it on the default store (``$GRABEN_URL``, else the embedded store at
``$GRABEN_HOME``). Registered with fsspec by the ``fsspec.specs`` entry point.

Paths inside the filesystem are the store's own: absolute, ``/a/b``. A full
URL names its store wherever it is passed: every method that takes a store
path sends a URL naming another store to that store's filesystem (one
instance per store, from fsspec's instance cache), and refuses a call that
names two stores. Names come back in the form they were asked in: listing
``graben://host:port/d`` answers ``graben://host:port/d/...``, which any
fresh ``fsspec.open`` reads from the same store; listing ``/d`` answers
``/d/...``, which ``unstrip_protocol`` turns into such a URL. What
fsspec would do slowly is done by the store: ranged reads, uploads in chunk
sized parts, copies that share chunks instead of moving bytes, atomic
renames, and transactions that publish every file in one commit.
"""

from __future__ import annotations

import datetime
import os
import posixpath
from collections.abc import Iterator
from typing import Any, ClassVar

from fsspec import AbstractFileSystem
from fsspec.callbacks import DEFAULT_CALLBACK, Callback
from fsspec.transaction import Transaction
from fsspec.utils import isfilelike, stringify_path

from .._buffers import pump, transfer_buffer
from .._config import Target, resolve
from .._errors import InvalidArgument, IsADirectory, NotFound
from .._types import Buffer, FileInfo
from ..client import Client, ReadFile, WriteFile, shared_client
from . import _exit, _urls
from ._options import OPTIONS, check_options

_MODES = ("wb", "xb")
_NOT_SHARED = frozenset({"url", "token", "token_file"})
"""Options a filesystem does not pass on to another store's: its address and its credential."""


class GrabenFileSystem(AbstractFileSystem):  # type: ignore[misc]
    """A graben store as an fsspec filesystem.

    ``GrabenFileSystem(url=None, **options)``: ``url`` as for
    ``graben.store.connect`` (``graben://host:port``, a local path, or
    ``None`` for the default store); ``options`` are ``Options`` fields.
    Errors are the store's, which subclass the builtins fsspec users catch
    (``FileNotFoundError``, ``FileExistsError``, ``IsADirectoryError``, ...).
    """

    protocol = _urls.PROTOCOL
    root_marker = "/"
    transaction_type: ClassVar[type[Transaction]]

    def __init__(self, url: str | None = None, **options: Any) -> None:
        check_options(options)
        super().__init__(url=url, **options)
        self.url = url
        self._options = {k: v for k, v in options.items() if k in OPTIONS}
        self._client: Client = shared_client(url, **self._options)
        self._target = resolve(url)
        # what this store's URLs start with; None for an embedded store (it has none of its own)
        self._base = _urls.url_of(self._target) if self._target.addresses else None
        _exit.track_filesystem(self)

    @property
    def client(self) -> Client:
        """The store's shared client (``graben.store.shared_client``): one per store per
        process, whichever door asks; made again if someone closed it."""
        if self._client.closed:
            self._client = shared_client(self.url, **self._options)
        return self._client

    # -- which store a path names -------------------------------------------------

    def _store_of(self, values: list[Any]) -> GrabenFileSystem:
        """The filesystem of the one store that ``values`` (paths, lists, dict keys) name."""
        named: dict[Target, str] = {}  # each store named, and how it was first named
        for base in _urls.bases(values):
            target = self._target if base is None or base == self._base else _urls.resolve(base)
            named.setdefault(target, self._label() if base is None else _urls.label(base))
        if len(named) > 1:  # decided before any connection to either store
            first, second = list(named.values())[:2]
            raise InvalidArgument(
                f"one call names two stores, {first} and {second}: a call reaches one store "
                "(to copy between stores, read from one and write to the other)"
            )
        target = next(iter(named), self._target)
        return self if target == self._target else self._other(target, named[target])

    def _other(self, target: Target, label: str) -> GrabenFileSystem:
        """Another store's filesystem (fsspec's instance cache keeps one per store)."""
        if self._intrans:
            raise InvalidArgument(
                f"a transaction covers one store ({self._label()}), and {label} is another"
            )
        shared = {k: v for k, v in self.storage_options.items() if k not in _NOT_SHARED}
        fs: GrabenFileSystem = type(self)(url=_urls.url_of(target), **shared)
        return fs

    def _label(self) -> str:
        """This store, as an error message names it."""
        return self._base or str(self._target.embedded)

    # -- URLs -------------------------------------------------------------------

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        """fsspec's form: ``graben://h:p/a/b`` -> ``h:p/a/b`` (the store stays, as an S3
        bucket does); ``graben:///a/b`` and ``/a/b`` -> ``/a/b``."""
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        return _urls.stripped(stringify_path(path))

    @staticmethod
    def _get_kwargs_from_urls(path: str) -> dict[str, Any]:
        if path.startswith(_urls.PREFIX):
            netloc = path[len(_urls.PREFIX) :].split("/", 1)[0]
            if netloc:
                return {"url": _urls.PREFIX + netloc}
        return {}

    @classmethod
    def _parent(cls, path: Any) -> Any:
        base, local = _urls.split(stringify_path(path))
        return _urls.named(base, super()._parent(_urls.store_path(local)))

    def unstrip_protocol(self, name: str) -> str:
        """The URL of a name: a URL as it is; ``h:p/a`` as ``graben://h:p/a``; a store
        path on this filesystem's store."""
        base, local = _urls.split(name)
        if base is not None:
            return _urls.full(base) + _urls.store_path(local)
        return f"{self._own_prefix()}{_urls.store_path(name)}"

    def _own_prefix(self) -> str:
        if self._base is not None:
            return self._base
        if self._target == resolve(None):
            return _urls.PREFIX  # graben:///a/b: the default store
        raise InvalidArgument(
            f"the embedded store at {self._target.embedded} has no graben:// URL "
            "(graben:///... names the default store, $GRABEN_HOME): use its plain "
            "paths on this filesystem, or make it the default store"
        )

    # -- listing and attributes: names in the form asked ------------------------------

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        return _entry(self.client.stat(_urls.store_path(path)), _urls.split(path)[0])

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        base = _urls.split(path)[0]
        entries = self.client.ls(_urls.store_path(path))
        if detail:
            return [_entry(e, base) for e in entries]
        return [_urls.named(base, e.path) for e in entries]

    def find(
        self,
        path: str,
        maxdepth: int | None = None,
        withdirs: bool = False,
        detail: bool = False,
        **kwargs: Any,
    ) -> Any:
        base, local = _urls.split(path)
        found = super().find(local, maxdepth=maxdepth, withdirs=withdirs, detail=detail, **kwargs)
        return _urls.all_named(base, found)

    def glob(self, path: str, maxdepth: int | None = None, **kwargs: Any) -> Any:
        base, local = _urls.split(path)  # the local part keeps a trailing slash: glob reads it
        return _urls.all_named(base, super().glob(local, maxdepth=maxdepth, **kwargs))

    def walk(
        self, path: str, maxdepth: int | None = None, topdown: bool = True, **kwargs: Any
    ) -> Iterator[tuple[str, Any, Any]]:
        base, local = _urls.split(path)
        for root, dirs, files in super().walk(local, maxdepth, topdown, **kwargs):
            if base is not None and isinstance(dirs, dict):
                # in place: a topdown caller prunes the walk by editing ``dirs``
                for info in (*dirs.values(), *files.values()):
                    info["name"] = base + info["name"]
            yield _urls.named(base, root), dirs, files

    def expand_path(
        self, path: Any, recursive: bool = False, maxdepth: int | None = None, **kwargs: Any
    ) -> list[str]:
        paths = [path] if isinstance(path, str | os.PathLike) else list(path)
        split = [_urls.split(stringify_path(p)) for p in paths]
        bases = {base for base, _ in split}
        base = bases.pop() if len(bases) == 1 else None  # mixed forms: plain names
        local = [p for _, p in split]
        return [
            _urls.named(base, p) for p in super().expand_path(local, recursive, maxdepth, **kwargs)
        ]

    def cat(
        self, path: Any, recursive: bool = False, on_error: str = "raise", **kwargs: Any
    ) -> Any:
        if not isinstance(path, str):  # a list: expand_path keeps each name's form
            return super().cat(path, recursive=recursive, on_error=on_error, **kwargs)
        base, local = _urls.split(path)
        out = super().cat(local, recursive=recursive, on_error=on_error, **kwargs)
        return _urls.all_named(base, out) if isinstance(out, dict) else out

    def exists(self, path: str, **kwargs: Any) -> bool:
        try:
            return self.client.exists(_urls.store_path(path))
        except (ValueError, NotADirectoryError):  # hostile path, or a file on the way
            return False

    def modified(self, path: str) -> datetime.datetime:
        info = self.client.stat(_urls.store_path(path))
        return datetime.datetime.fromtimestamp(info.mtime_ns / 1e9, datetime.UTC)

    created = modified  # a version is created by its commit

    def checksum(self, path: str) -> int:
        """Changes whenever a new version is committed at ``path``."""
        info = self.client.stat(_urls.store_path(path))
        return hash((info.inode, info.generation, info.size))

    # -- namespace ----------------------------------------------------------------

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        self.client.mkdir(_urls.store_path(path), parents=create_parents)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self.client.mkdir(_urls.store_path(path), parents=True, exist_ok=exist_ok)

    def rmdir(self, path: str) -> None:
        path = _urls.store_path(path)
        if not self.client.stat(path).is_dir:
            raise NotADirectoryError(f"not a directory: {path}")
        self.client.rm(path)

    def rm_file(self, path: str) -> None:
        path = _urls.store_path(path)
        if self.client.stat(path).is_dir:
            raise IsADirectory("is a directory (use rm with recursive=True)", path)
        self.client.rm(path)

    def _rm(self, path: str) -> None:
        self.client.rm(_urls.store_path(path))

    def rm(
        self, path: str | list[str], recursive: bool = False, maxdepth: int | None = None
    ) -> None:
        """Remove paths; ``recursive`` takes whole trees, each in one transaction."""
        if maxdepth is not None:  # fsspec's own walk honours the depth
            super().rm(path, recursive=recursive, maxdepth=maxdepth)
            return
        paths = [path] if isinstance(path, str) else list(path)
        for p in paths:
            if _has_magic(p):
                self.rm(self.expand_path(p, recursive=recursive), recursive=recursive)
                continue
            try:
                self.client.rm(_urls.store_path(p), recursive=recursive)
            except NotFound:
                if isinstance(path, str):
                    raise
                # a list from expand_path names children of trees removed before them

    def mv(
        self,
        path1: str | list[str],
        path2: str | list[str],
        recursive: bool = False,
        maxdepth: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Atomic rename (files and whole directories): never a copy and a delete.

        Like ``shutil.move``, a source moved onto an existing directory goes
        inside it.
        """
        if not (isinstance(path1, str) and isinstance(path2, str)) or _has_magic(path1):
            super().mv(path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs)
            return
        src, dst = _urls.store_path(path1), _urls.store_path(path2)
        if src != dst and self.isdir(dst):
            dst = posixpath.join(dst, posixpath.basename(src))
        self.client.rename(src, dst)

    rename = mv

    # -- data ---------------------------------------------------------------------

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        path = _urls.store_path(path)
        if (start or 0) >= 0 and (end is None or end >= 0):
            return self.client.get_range(path, start or 0, end)
        size = self.client.stat(path).size  # negative offsets count from the end
        first = max(0, size + start) if start is not None and start < 0 else start or 0
        last = max(0, size + end) if end is not None and end < 0 else end
        return self.client.get_range(path, first, max(first, last) if last is not None else None)

    def pipe_file(self, path: str, value: Buffer, mode: str = "overwrite", **kwargs: Any) -> None:
        """Store ``value`` at ``path``; ``mode="create"`` raises ``FileExistsError`` if present."""
        if mode not in ("overwrite", "create"):
            raise InvalidArgument(f"pipe_file mode must be 'overwrite' or 'create', not {mode!r}")
        if self._intrans:  # one of the transaction's files: visible with the rest, or never
            with self.open(path, "xb" if mode == "create" else "wb") as f:
                f.write(value)
            return
        self.client.put(_urls.store_path(path), value, exclusive=mode == "create")

    def put_file(
        self,
        lpath: str,
        rpath: str,
        callback: Callback = DEFAULT_CALLBACK,
        mode: str = "overwrite",
        **kwargs: Any,
    ) -> None:
        """Upload a local file in chunk-sized parts (a local directory: makes ``rpath``)."""
        if os.path.isdir(lpath):
            self.makedirs(rpath, exist_ok=True)
            return
        with (  # self.open: in a transaction, the file is one of its own
            open(lpath, "rb", buffering=0) as src,
            self.open(rpath, "xb" if mode == "create" else "wb") as dst,
            transfer_buffer(self.client.chunk_size) as block,
        ):
            callback.set_size(os.fstat(src.fileno()).st_size)
            pump(src.readinto, dst.write, block, callback.relative_update)

    def get_file(
        self,
        rpath: str,
        lpath: str,
        callback: Callback = DEFAULT_CALLBACK,
        outfile: Any = None,
        **kwargs: Any,
    ) -> None:
        """Download to a local file (a directory: makes ``lpath``)."""
        rpath = _urls.store_path(rpath)
        if self.client.stat(rpath).is_dir:
            os.makedirs(lpath, exist_ok=True)
            return
        if outfile is None and isfilelike(lpath):
            outfile = lpath
        with (
            self.client.open(rpath, "rb") as src,
            transfer_buffer(self.client.chunk_size) as block,
        ):
            callback.set_size(src.info.size)
            if outfile is not None:
                pump(src.readinto, outfile.write, block, callback.relative_update)
                return
            os.makedirs(os.path.dirname(os.path.abspath(lpath)), exist_ok=True)
            with open(lpath, "wb") as dst:
                pump(src.readinto, dst.write, block, callback.relative_update)

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        """Copy inside the store: the copy shares the source's chunks, no byte moves."""
        src, dst = _urls.store_path(path1), _urls.store_path(path2)
        if self.client.stat(src).is_dir:
            self.makedirs(dst, exist_ok=True)
            return
        if self._intrans:  # a copy in a transaction is one of its files: its bytes move
            with (
                self.client.open(src) as source,
                self.open(dst, "wb") as target,
                transfer_buffer(self.client.chunk_size) as block,
            ):
                pump(source.readinto, target.write, block, lambda _: None)
            return
        self.client.copy(src, dst)

    def touch(self, path: str, truncate: bool = True, **kwargs: Any) -> None:
        if truncate or not self.exists(path):
            self.pipe_file(path, b"")
        # without truncate an existing file is left as is: versions are immutable

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> ReadFile | WriteFile:
        path = _urls.store_path(path)
        if mode not in ("rb", *_MODES):
            raise InvalidArgument(f"graben files open as 'rb', 'wb' or 'xb', not {mode!r}", path)
        file = (
            self.client.open(path, "rb")
            if mode == "rb"
            else self._writer(path, mode, autocommit=autocommit)
        )
        _exit.track_file(file)  # pyarrow may hold it to exit
        return file

    def _writer(self, path: str, mode: str, *, autocommit: bool = True) -> WriteFile:
        exclusive = mode == "xb"
        path = _urls.store_path(path)
        return self.client.open(path, "xb" if exclusive else "wb", autocommit=autocommit)


class GrabenTransaction(Transaction):  # type: ignore[misc]
    """``with fs.transaction:`` publishes every file written in it in one commit.

    Files opened inside upload as they are written; at the end of the block
    all of them appear at once, or (on an exception, or if any upload
    failed) none does.
    """

    def complete(self, commit: bool = True) -> None:
        files: list[WriteFile] = list(self.files)
        self.files.clear()
        self.fs._intrans = False  # whatever happens below, the transaction is over
        try:
            if commit:
                for f in files:
                    f.close()
                fs: GrabenFileSystem = self.fs
                fs.client.commit_uploads([f.upload for f in files])
                return
        except BaseException:
            _discard(files)
            raise
        _discard(files)


GrabenFileSystem.transaction_type = GrabenTransaction


_urls.route_every_store_path(GrabenFileSystem)


def _discard(files: list[WriteFile]) -> None:
    for f in files:
        f.discard()


def _entry(info: FileInfo, base: str | None = None) -> dict[str, Any]:
    return {
        "name": _urls.named(base, info.path),
        "size": info.size,
        "type": info.kind,
        "mtime": info.mtime_ns / 1e9,
        "mode": info.mode,
        "inode": info.inode,
        "generation": info.generation,
        "replication": info.replication,
    }


def _has_magic(path: str) -> bool:
    return any(c in path for c in "*?[")
