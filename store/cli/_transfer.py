"""The store's commands that move bytes: cat, get and put.

Data moves through one reused, page-aligned buffer of the store's chunk size
(DESIGN.md "Wire": a touched mmap copies ~10x faster than fresh memory), so
a transfer never holds more than one block in memory. A get writes its local
file whole or not at all; a put commits each file whole or not at all.
"""

from __future__ import annotations

import argparse
import io
import os
import posixpath
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO, Literal, TypeAlias

from .._buffers import ReadInto, Tick, pump, transfer_buffer
from .._errors import InvalidArgument, IsADirectory
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
from ._tls import client_tls

WriteMode: TypeAlias = Literal["wb", "xb"]
STDIO = "-"
"""The local name of stdin and stdout."""


def cat(args: argparse.Namespace) -> int:
    start, end = args.range or (0, None)
    store, (path,) = locate(args.store, args.path)
    with (
        open_client(store, timeout=args.timeout, tls=client_tls(args)) as client,
        client.open(path, "rb") as src,
    ):
        size = src.info.size
        stop = size if end is None else min(end, size)
        src.seek(min(start, size))
        _to_stdout(client, src, max(0, stop - start), path)
    return 0


def get(args: argparse.Namespace) -> int:
    store, (remote,) = locate(args.store, args.remote)
    with (
        open_client(store, timeout=args.timeout, tls=client_tls(args)) as client,
        client.open(remote, "rb") as src,
    ):
        size = src.info.size
        if args.local == STDIO:
            _to_stdout(client, src, size, remote)
        else:
            dest = _local_dest(args.local, posixpath.basename(normalize(remote)))
            _to_local(client, src, size, dest)
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
    """``local``, or ``local/name`` if it ends with a separator or is a directory."""
    path = Path(local)
    if local.endswith(os.sep) or path.is_dir():
        return path / name
    return path


def _to_local(client: Client, src: ReadFile, size: int, dest: Path) -> None:
    """Stream ``src`` into the local file ``dest``, whole or not at all."""
    allowed = out.progress_allowed()
    with (
        local_errors(dest),
        _replacing(dest) as sink,
        transfer_buffer(client.chunk_size) as block,
        out.Meter(dest.name, size, enabled=allowed) as meter,
    ):
        pump(src.readinto, sink.write, block, meter)


@contextmanager
def _replacing(dest: Path) -> Iterator[BinaryIO]:
    """A new file beside ``dest``: renamed over it if the block succeeds, deleted if not.

    So ``dest`` holds either its old content or the whole new file, never a
    piece: a failed or interrupted get leaves nothing behind.
    """
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    try:
        with open(fd, "wb") as sink:
            os.fchmod(fd, 0o666 & ~_umask())  # what a plain open() would have given
            yield sink
        os.replace(tmp, dest)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    # The only way to read the umask is to set it; set it straight back.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def put(args: argparse.Namespace) -> int:
    store, (remote,) = locate(args.store, args.remote)
    mode: WriteMode = "xb" if args.exclusive else "wb"
    with open_client(store, create=True, timeout=args.timeout, tls=client_tls(args)) as client:
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
