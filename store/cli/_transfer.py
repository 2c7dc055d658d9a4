"""The store's commands that move bytes: cat, get and put.

Data moves through one reused, page-aligned buffer of the store's chunk size
(docs/architecture.md, "Wire": a touched buffer copies ~10x faster than fresh memory), so
a transfer never holds more than one block in memory. A get writes its local
file whole or not at all; a put commits each file whole or not at all.
"""

from __future__ import annotations

import argparse
import io
import os
import posixpath
import secrets
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO, Literal, TypeAlias

from .._buffers import ReadInto, Tick, pump, transfer_buffer
from .._errors import AlreadyExists, InvalidArgument, IsADirectory, NotADirectory
from .._paths import normalize
from ..client import Client, ReadFile
from . import _render as out
from ._stores import (
    local_errors,
    locate,
    open_client,
    remote_dest,
    remote_is_dir,
)
from ._trees import Entry, walk, without_links

WriteMode: TypeAlias = Literal["wb", "xb"]
STDIO = "-"
"""The local name of stdin and stdout."""


def cat(args: argparse.Namespace) -> int:
    start, end = args.range or (0, None)
    store, (path,) = locate(args.store, args.path)
    with (
        open_client(store, args) as client,
        client.open(path, "rb") as src,
    ):
        size = src.info.size
        stop = size if end is None else min(end, size)
        src.seek(min(start, size))
        _to_stdout(client, src, max(0, stop - start), path)
    return 0


def get(args: argparse.Namespace) -> int:
    store, (remote,) = locate(args.store, args.remote)
    with open_client(store, args) as client:
        if args.local == STDIO:
            with client.open(remote, "rb") as src:
                _to_stdout(client, src, src.info.size, remote)
            return 0
        listed = walk(client, remote) if args.recursive else [Entry((), client.stat(remote))]
        entries = without_links(listed, "get")
        if entries[0].info.is_dir and not args.recursive:
            raise IsADirectory("is a directory (use get -r to download a tree)", remote)
        dest = _local_dest(args.local, posixpath.basename(normalize(remote)))
        _get_entries(client, entries, dest, exclusive=args.exclusive)
    return 0


def _to_stdout(client: Client, src: ReadFile, count: int, label: str) -> None:
    """Stream ``count`` bytes of ``src`` to stdout."""
    allowed = out.progress_allowed(data_to_stdout=True)
    sink = sys.stdout.buffer
    with (
        transfer_buffer(client.chunk_size) as block,
        out.Meter(label, count, enabled=allowed) as meter,
    ):
        pump(src.readinto, sink.write, block, meter, count)
        sink.flush()


def _local_dest(local: str, name: str) -> Path:
    """``local``, or ``local/name`` if it ends with a separator (a directory, made if
    missing, as the user named one) or is a directory."""
    path = Path(local)
    if local.endswith(os.sep):
        with local_errors(path):
            path.mkdir(parents=True, exist_ok=True)
        return path / name
    return path / name if path.is_dir() else path


def _get_entries(client: Client, entries: list[Entry], dest: Path, *, exclusive: bool) -> None:
    """Write a walked file or tree at ``dest``: each file whole or not at all.

    Everything is reached through directory descriptors opened without
    following links, so a link planted in ``dest``'s tree is refused, never
    written through; only ``dest``'s own parent is taken as the user named it.
    """
    top = dest.parent
    if exclusive:
        _refuse_existing(top, dest.name, entries)
    size = sum(e.info.size for e in entries if not e.info.is_dir)
    label = dest.name if len(entries) == 1 else f"{len(entries)} entries"
    with (
        local_errors(top),
        _DirectoryStack(top) as dirs,
        transfer_buffer(client.chunk_size) as block,
        out.Meter(label, size, enabled=out.progress_allowed()) as meter,
    ):
        for entry in entries:
            parts = (dest.name, *entry.parts)
            parent = dirs.parent_of(parts)
            with local_errors(top.joinpath(*parts)):
                if entry.info.is_dir:
                    dirs.enter(parent, parts[-1], top.joinpath(*parts))
                else:
                    _download(client.open(entry.info.path, "rb"), parent, parts[-1], block, meter)


def _download(src: ReadFile, parent: int, name: str, block: memoryview, meter: Tick) -> None:
    """Stream ``src`` into ``name`` in the directory ``parent``, whole or not at all."""
    with src, _replacing(parent, name) as sink:
        pump(src.readinto, sink.write, block, meter)


def _refuse_existing(top: Path, name: str, entries: list[Entry]) -> None:
    """``get -x``: refuse before writing anything if any file would replace one."""
    for entry in entries:
        path = top.joinpath(name, *entry.parts)
        if not entry.info.is_dir and os.path.lexists(path):
            raise AlreadyExists("exists (local; get -x replaces nothing)", str(path))


class _DirectoryStack:
    """Open directories from ``top`` down to where a walk is, each opened beneath
    its parent's descriptor without following a link."""

    def __init__(self, top: Path) -> None:
        self._top = top
        self._fds: list[int] = []

    def __enter__(self) -> _DirectoryStack:
        self._fds.append(os.open(self._top, os.O_RDONLY | os.O_DIRECTORY))
        return self

    def __exit__(self, *exc: object) -> None:
        self._close_to(0)

    def parent_of(self, parts: tuple[str, ...]) -> int:
        """The descriptor of ``parts``' parent: a walk lists each directory before its
        entries, so it is the last one opened at that depth."""
        self._close_to(len(parts))
        return self._fds[-1]

    def enter(self, parent: int, name: str, path: Path) -> None:
        """Make (if missing) and open the directory ``name`` (at ``path``) beneath ``parent``."""
        with suppress(FileExistsError):
            os.mkdir(name, dir_fd=parent)
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
        try:
            self._fds.append(os.open(name, flags, dir_fd=parent))
        except OSError:
            if stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                raise NotADirectory("a symbolic link, never followed (local)", str(path)) from None
            raise

    def _close_to(self, depth: int) -> None:
        while len(self._fds) > depth:
            os.close(self._fds.pop())


@contextmanager
def _replacing(parent: int, name: str) -> Iterator[BinaryIO]:
    """A new file beside ``name`` in the directory ``parent``: renamed over it if the
    block succeeds, deleted if not.

    So ``name`` holds either its old content or the whole new file, never a
    piece: a failed or interrupted get leaves nothing behind. A link at
    ``name`` is replaced, not written through.
    """
    short = name.encode()[:200].decode(errors="ignore")  # room for the rest in 255 bytes
    tmp = f".{short}.{secrets.token_hex(4)}.part"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o666, dir_fd=parent)  # the mode a plain open() gives
    try:
        with open(fd, "wb") as sink:
            yield sink
        os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=parent)
        raise


def put(args: argparse.Namespace) -> int:
    store, (remote,) = locate(args.store, args.remote)
    mode: WriteMode = "xb" if args.exclusive else "wb"
    with open_client(store, args, create=True) as client:
        if args.local == STDIO:
            _put_stdin(client, remote, mode)
            return 0
        local = Path(args.local)
        dest = remote_dest(client, remote, local.name)
        if local.is_dir():
            if not args.recursive:
                raise IsADirectory("is a directory (use put -r to upload a tree)", args.local)
            _put_tree(client, local, dest, mode)
        else:
            _put_files(client, [(local, dest)], mode)
    return 0


def _put_stdin(client: Client, remote: str, mode: WriteMode) -> None:
    if remote.endswith("/") or remote_is_dir(client, remote):
        raise IsADirectory("stdin has no name: give the full path of the new file", remote)
    allowed = out.progress_allowed()
    with (
        transfer_buffer(client.chunk_size) as block,
        out.Meter("stdin", None, enabled=allowed) as meter,
    ):
        _upload(client, _stdin_reader(), remote, mode, block, meter)


def _stdin_reader() -> ReadInto:
    # ``sys.stdin.buffer`` is typed ``BinaryIO``, which promises no ``readinto``;
    # in practice it is a buffered (or, under test harnesses, in-memory) binary stream.
    stream = sys.stdin.buffer
    if not isinstance(stream, io.BufferedIOBase | io.RawIOBase):
        raise InvalidArgument("stdin cannot be read as bytes")
    return stream.readinto


def _put_tree(client: Client, root: Path, dest: str, mode: WriteMode) -> None:
    """Upload a local tree to ``dest``; empty directories are created too."""
    dirs, files = _plan_tree(root, dest)
    for remote_dir in dirs:
        client.mkdir(remote_dir, parents=True, exist_ok=True)
    _put_files(client, files, mode)


def _plan_tree(root: Path, dest: str) -> tuple[list[str], list[tuple[Path, str]]]:
    """The remote directories and (local file, remote path) pairs of a local tree."""
    dirs, files = [], []
    with local_errors(root):
        for top, subdirs, names in os.walk(root, onerror=_raise):
            subdirs.sort()
            rel = Path(top).relative_to(root).as_posix()
            remote_dir = dest if rel == "." else posixpath.join(dest, rel)
            dirs.append(remote_dir)
            files += [(Path(top, n), posixpath.join(remote_dir, n)) for n in sorted(names)]
    return dirs, files


def _raise(exc: OSError) -> None:
    raise exc


def _put_files(client: Client, files: list[tuple[Path, str]], mode: WriteMode) -> None:
    """Upload local files, one progress bar for all of them."""
    with local_errors(files[0][0] if files else "."):
        total = sum(local.stat().st_size for local, _ in files)
    label = files[0][0].name if len(files) == 1 else f"{len(files)} files"
    allowed = out.progress_allowed()
    with (
        transfer_buffer(client.chunk_size) as block,
        out.Meter(label, total, enabled=allowed) as meter,
    ):
        for local, remote in files:
            with local_errors(local), open(local, "rb", buffering=0) as src:
                _upload(client, src.readinto, remote, mode, block, meter)


def _upload(
    client: Client,
    read_into: ReadInto,
    remote: str,
    mode: WriteMode,
    block: memoryview,
    meter: Tick,
) -> None:
    """Stream everything ``read_into`` gives into a new file at ``remote``.

    The file is committed when the ``with`` block ends, and discarded if
    reading fails: the store never shows a partial upload.
    """
    with client.open(remote, mode) as sink:
        pump(read_into, sink.write, block, meter)
