"""The store's ``graben`` subcommands: ls stat du mkdir rm mv cat put get fsck.

Each ``add_X`` is a ``graben.commands`` entry point (see ``_cli``): it adds one
parser whose ``run`` returns the exit code. Store errors are simply raised;
the dispatcher prints them as one line and exits 1. Local-disk errors are
turned into store errors first, for the same reason.

Data moves through one reused, page-aligned buffer of the store's chunk size
(DESIGN.md "Wire": a touched mmap copies ~10x faster than fresh memory), so
a transfer never holds more than one block in memory.
"""

from __future__ import annotations

import argparse
import io
import os
import posixpath
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO, Literal, TypeAlias

from . import _cli_render as out
from ._buffers import ReadInto, Tick, pump, transfer_buffer
from ._client import Client, connect
from ._config import resolve, split_url
from ._errors import (
    DirectoryNotEmpty,
    GrabenError,
    InvalidArgument,
    IsADirectory,
    NotADirectory,
    NotFound,
    from_os_error,
)
from ._files import ReadFile
from ._paths import normalize

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
Run: TypeAlias = Callable[[argparse.Namespace], int]
WriteMode: TypeAlias = Literal["wb", "xb"]

STDIO = "-"
_STORE_HELP = (
    "an embedded store directory or graben://host:port "
    "(default: $GRABEN_URL, else the embedded store at $GRABEN_HOME)"
)
_PATH_HELP = "store path, or a graben://host:port/path URL naming the store too"


# --- parsers ----------------------------------------------------------------------


def _command(sub: Subparsers, name: str, summary: str, run: Run) -> argparse.ArgumentParser:
    """A subcommand parser with the options every store command shares."""
    parser = sub.add_parser(name, help=summary, description=summary)
    parser.add_argument("--store", metavar="URL", help=_STORE_HELP)
    parser.set_defaults(run=run)
    return parser


def _json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON (and nothing else)")


def _human_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-H", "--human", action="store_true", help="sizes in KiB, MiB, GiB (default: bytes)"
    )


def add_ls(sub: Subparsers) -> None:
    """``graben ls [PATH] [-l] [-H] [--json]``."""
    parser = _command(sub, "ls", "List a directory (or show one file).", _ls)
    parser.add_argument("path", nargs="?", default="/", help=f"{_PATH_HELP} (default: /)")
    parser.add_argument(
        "-l", dest="long", action="store_true", help="long format: kind, size, mtime, name"
    )
    _human_flag(parser)
    _json_flag(parser)


def add_stat(sub: Subparsers) -> None:
    """``graben stat PATH [--json]``."""
    parser = _command(sub, "stat", "Show the attributes of a file or directory.", _stat)
    parser.add_argument("path", help=_PATH_HELP)
    _json_flag(parser)


def add_du(sub: Subparsers) -> None:
    """``graben du [PATH] [-H] [--json]``."""
    parser = _command(sub, "du", "Count the files and bytes at or below a path.", _du)
    parser.add_argument("path", nargs="?", default="/", help=f"{_PATH_HELP} (default: /)")
    _human_flag(parser)
    _json_flag(parser)


def add_mkdir(sub: Subparsers) -> None:
    """``graben mkdir PATH [-p]``."""
    parser = _command(sub, "mkdir", "Create a directory.", _mkdir)
    parser.add_argument("path", help=_PATH_HELP)
    parser.add_argument(
        "-p", "--parents", action="store_true", help="create missing parents; no error if it exists"
    )


def add_rm(sub: Subparsers) -> None:
    """``graben rm PATH [-r]``."""
    parser = _command(sub, "rm", "Remove a file or an empty directory.", _rm)
    parser.add_argument("path", help=_PATH_HELP)
    parser.add_argument(
        "-r", "--recursive", action="store_true", help="remove a directory and everything in it"
    )


def add_mv(sub: Subparsers) -> None:
    """``graben mv SRC DST [--no-clobber]``."""
    parser = _command(sub, "mv", "Move or rename a file or directory, atomically.", _mv)
    parser.add_argument("src", help=_PATH_HELP)
    parser.add_argument(
        "dst", help="destination path; an existing directory (or a trailing /) moves SRC into it"
    )
    parser.add_argument(
        "-n", "--no-clobber", action="store_true", help="fail instead of replacing DST"
    )


def add_cat(sub: Subparsers) -> None:
    """``graben cat PATH [--range START:END]``."""
    parser = _command(sub, "cat", "Write a file's bytes to stdout.", _cat)
    parser.add_argument("path", help=_PATH_HELP)
    parser.add_argument(
        "--range",
        type=_byte_range,
        metavar="START:END",
        help="only bytes START up to (not including) END; either may be left out",
    )


def add_put(sub: Subparsers) -> None:
    """``graben put LOCAL REMOTE [--exclusive] [-r]``."""
    parser = _command(sub, "put", "Upload a local file (or - for stdin) into the store.", _put)
    parser.add_argument("local", help="local file, directory (with -r), or - for stdin")
    parser.add_argument(
        "remote", help="store path; an existing directory (or a trailing /) gets the local name"
    )
    parser.add_argument(
        "-x", "--exclusive", action="store_true", help="fail if the store path already exists"
    )
    parser.add_argument(
        "-r", "--recursive", action="store_true", help="upload a local directory tree"
    )


def add_get(sub: Subparsers) -> None:
    """``graben get REMOTE LOCAL``."""
    parser = _command(sub, "get", "Download a file from the store (LOCAL - for stdout).", _get)
    parser.add_argument("remote", help=_PATH_HELP)
    parser.add_argument(
        "local", help="local file or directory, or - for stdout; written whole or not at all"
    )


def add_fsck(sub: Subparsers) -> None:
    """``graben fsck [--collect [--grace SECONDS] [--force]] [--json]``."""
    summary = (
        "Re-read and verify every chunk and the metadata; "
        "exit 1 if anything is missing, corrupt or inconsistent."
    )
    parser = _command(sub, "fsck", summary, _fsck)
    parser.add_argument(
        "--collect",
        action="store_true",
        help="delete orphan chunk files, long-unused chunks and writers' leftover temporaries",
    )
    parser.add_argument(
        "--grace",
        type=_seconds,
        metavar="SECONDS",
        default=None,
        help="collect only what is older than this (default: the store's, an hour)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="collect even if the metadata looks wrong (inconsistent, or naming far "
        "fewer chunks than the nodes hold)",
    )
    _json_flag(parser)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds, 0 or more")
    return value


def _byte_range(text: str) -> tuple[int, int | None]:
    """``START:END`` -> ``(start, end)``; ``END`` may be empty (to the end of the file)."""
    start_text, colon, end_text = text.partition(":")
    try:
        start = int(start_text) if start_text else 0
        end = int(end_text) if end_text else None
    except ValueError:
        start, end = -1, None
    if not colon or start < 0 or (end is not None and end < start):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not START:END with 0 <= START <= END (either may be left out)"
        )
    return start, end


# --- which store -------------------------------------------------------------------


def _locate(flag: str | None, *paths: str) -> tuple[str | None, list[str]]:
    """The store to use and the plain paths, from ``--store`` and paths that may be URLs.

    A ``graben://host:port/path`` names its store; it must agree with
    ``--store`` and with the other paths. ``None`` means the default store.
    """
    store, plain = flag, []
    for text in paths:
        named, path = split_url(text)
        if named is not None:
            if store is not None and resolve(store) != resolve(named):
                raise InvalidArgument(f"{text} is in store {named}, not in {store}")
            store = named
        plain.append(path)
    return store, plain


@contextmanager
def _client(store: str | None, *, create: bool = False) -> Iterator[Client]:
    """A client of ``store``; commands that only read refuse to create a store.

    Opening an embedded store creates its directory, so a mistyped
    ``--store`` on ``ls`` would otherwise leave a new empty store behind.
    """
    if not create:
        _require_store(store)
    with connect(store) as client:
        yield client


def _require_store(store: str | None) -> None:
    home = resolve(store).embedded
    if home is not None and not home.is_dir():
        raise NotFound("no store here (put or mkdir creates one)", str(home))


def _remote_is_dir(client: Client, path: str) -> bool:
    try:
        return client.stat(path).is_dir
    except (NotFound, NotADirectory):
        return False


def _remote_dest(client: Client, path: str, name: str) -> str:
    """``path``, or ``path/name`` if it ends with ``/`` or is an existing directory."""
    if path.endswith("/") or _remote_is_dir(client, path):
        return posixpath.join(path, name)
    return path


# --- namespace commands ---------------------------------------------------------------


def _ls(args: argparse.Namespace) -> int:
    store, (path,) = _locate(args.store, args.path)
    with _client(store) as client:
        infos = client.ls(path)
    if args.json:
        out.emit_json(infos)
    else:
        out.emit_lines(out.ls_lines(infos, normalize(path), long=args.long, human=args.human))
    return 0


def _stat(args: argparse.Namespace) -> int:
    store, (path,) = _locate(args.store, args.path)
    with _client(store) as client:
        info = client.stat(path)
    if args.json:
        out.emit_json(info)
    else:
        out.emit_lines(out.stat_lines(info))
    return 0


def _du(args: argparse.Namespace) -> int:
    store, (path,) = _locate(args.store, args.path)
    with _client(store) as client:
        files, size = client.du(path)
    clean = normalize(path)
    if args.json:
        out.emit_json({"path": clean, "files": files, "bytes": size})
    else:
        out.emit_lines([out.du_line(clean, files, size, human=args.human)])
    return 0


def _mkdir(args: argparse.Namespace) -> int:
    store, (path,) = _locate(args.store, args.path)
    with _client(store, create=True) as client:
        client.mkdir(path, parents=args.parents, exist_ok=args.parents)
    return 0


def _rm(args: argparse.Namespace) -> int:
    store, (path,) = _locate(args.store, args.path)
    with _client(store) as client:
        try:
            client.rm(path, recursive=args.recursive)
        except DirectoryNotEmpty:
            # The store's message speaks of a keyword argument; name the flag.
            raise DirectoryNotEmpty(
                "directory not empty (use rm -r to remove it and everything in it)", path
            ) from None
    return 0


def _mv(args: argparse.Namespace) -> int:
    store, (src, dst) = _locate(args.store, args.src, args.dst)
    with _client(store) as client:
        dest = _remote_dest(client, dst, posixpath.basename(normalize(src)))
        client.rename(src, dest, replace=not args.no_clobber)
    return 0


def _fsck(args: argparse.Namespace) -> int:
    with _client(args.store) as client:
        allowed = out.progress_allowed(json=args.json)
        with out.Meter("fsck", None, enabled=allowed) as meter:
            report = client.fsck(
                collect=args.collect, grace=args.grace, force=args.force, progress=meter
            )
    if args.json:
        out.emit_json(out.fsck_json(report))
    else:
        out.emit_lines(out.fsck_lines(report))
    return 0 if report.ok else 1


# --- reading from the store -----------------------------------------------------------


def _cat(args: argparse.Namespace) -> int:
    start, end = args.range or (0, None)
    store, (path,) = _locate(args.store, args.path)
    with _client(store) as client, client.open(path, "rb") as src:
        size = src.info.size
        stop = size if end is None else min(end, size)
        src.seek(min(start, size))
        _to_stdout(client, src, max(0, stop - start), path)
    return 0


def _get(args: argparse.Namespace) -> int:
    store, (remote,) = _locate(args.store, args.remote)
    with _client(store) as client, client.open(remote, "rb") as src:
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
        _local_errors(dest),
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


# --- writing into the store -----------------------------------------------------------


def _put(args: argparse.Namespace) -> int:
    store, (remote,) = _locate(args.store, args.remote)
    mode: WriteMode = "xb" if args.exclusive else "wb"
    with _client(store, create=True) as client:
        if args.local == STDIO:
            _put_stdin(client, remote, mode)
            return 0
        local = Path(args.local)
        dest = _remote_dest(client, remote, local.name)
        if local.is_dir():
            if not args.recursive:
                raise IsADirectory("is a directory (use put -r to upload a tree)", args.local)
            _put_tree(client, local, dest, mode)
        else:
            _put_files(client, [(local, dest)], mode)
    return 0


def _put_stdin(client: Client, remote: str, mode: WriteMode) -> None:
    if remote.endswith("/") or _remote_is_dir(client, remote):
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
    with _local_errors(root):
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
    with _local_errors(files[0][0] if files else "."):
        total = sum(local.stat().st_size for local, _ in files)
    label = files[0][0].name if len(files) == 1 else f"{len(files)} files"
    allowed = out.progress_allowed()
    with (
        transfer_buffer(client.chunk_size) as block,
        out.Meter(label, total, enabled=allowed) as meter,
    ):
        for local, remote in files:
            with _local_errors(local), open(local, "rb", buffering=0) as src:
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


# --- plumbing -------------------------------------------------------------------------


@contextmanager
def _local_errors(path: str | os.PathLike[str]) -> Iterator[None]:
    """Report local-disk failures as store errors, so the dispatcher prints one line."""
    try:
        yield
    except GrabenError:  # some are OSErrors too; they are already what we want
        raise
    except OSError as exc:
        error = from_os_error(exc, os.fspath(path))
        raise type(error)(f"{exc.strerror or exc} (local)", os.fspath(path)) from exc
