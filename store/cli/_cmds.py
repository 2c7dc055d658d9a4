"""The store's ``graben`` subcommands: ls stat du mkdir rm mv cp cat put get fsck.

Each ``add_X`` is a ``graben.commands`` entry point (see ``_main``): it adds one
parser whose ``run`` returns the exit code. Store errors are simply raised;
the dispatcher prints them as one line and exits 1. Local-disk errors are
turned into store errors first, for the same reason (``_stores``). The
commands that move bytes (cat, get, put) run in ``_transfer``; those that walk
a tree (cp, du --physical, get -r) use ``_trees``.
"""

from __future__ import annotations

import argparse
import posixpath
from collections.abc import Callable
from typing import TypeAlias

import msgspec

from .._errors import DirectoryNotEmpty
from .._paths import normalize
from . import _render as out
from . import _transfer, _trees
from ._stores import locate, open_client, remote_dest, timeout_arg
from ._tls import tls_arg

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
Run: TypeAlias = Callable[[argparse.Namespace], int]

_STORE_HELP = (
    "an embedded store directory or graben://host:port (several metadata services: "
    "graben://h1:7100,h2:7100) "
    "(default: $GRABEN_URL, else the embedded store at $GRABEN_HOME)"
)
_PATH_HELP = "store path, or a graben://host:port/path URL naming the store too"


# --- parsers ----------------------------------------------------------------------


def _command(
    sub: Subparsers, name: str, summary: str, run: Run, *, short_help: bool = True
) -> argparse.ArgumentParser:
    """A subcommand parser with the options every store command shares (``short_help``
    False: ``--help`` only, ``-h`` left for the command's own use, as ``du -h``)."""
    parser = sub.add_parser(name, help=summary, description=summary, add_help=short_help)
    if not short_help:
        parser.add_argument("--help", action="help", help="show this help message and exit")
    parser.add_argument("--store", metavar="URL", help=_STORE_HELP)
    timeout_arg(parser)
    tls_arg(parser)
    parser.set_defaults(run=run)
    return parser


def _json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON (and nothing else)")


def _human_flag(parser: argparse.ArgumentParser, *short: str) -> None:
    """Sizes in KiB, MiB, GiB (the default; ``-H`` still says so) or, with ``-b``, in bytes
    (``--json`` always gives bytes)."""
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument(
        "-b", "--bytes", dest="human", action="store_false", help="sizes in bytes, exactly"
    )
    sizes.add_argument(
        *short,
        "-H",
        "--human",
        dest="human",
        action="store_true",
        help="sizes in KiB, MiB, GiB (the default)",
    )
    parser.set_defaults(human=True)


def add_ls(sub: Subparsers) -> None:
    """``graben ls [PATH] [-l] [-b] [--json]``."""
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
    """``graben du [PATH] [--physical] [-b] [--json]`` (``-h`` as Unix ``du``'s, the default)."""
    summary = "Count the files and bytes at or below a path."
    parser = _command(sub, "du", summary, _du, short_help=False)
    parser.add_argument("path", nargs="?", default="/", help=f"{_PATH_HELP} (default: /)")
    parser.add_argument(
        "--physical",
        action="store_true",
        help="the bytes the store holds for them: each distinct chunk once, times its "
        "copies (reads every file's layout)",
    )
    _human_flag(parser, "-h")
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
    parser = _command(sub, "cat", "Write a file's bytes to stdout.", _transfer.cat)
    parser.add_argument("path", help=_PATH_HELP)
    parser.add_argument(
        "--range",
        type=_byte_range,
        metavar="START:END",
        help="only bytes START up to (not including) END; either may be left out",
    )


def add_put(sub: Subparsers) -> None:
    """``graben put LOCAL REMOTE [--exclusive] [-r]``."""
    parser = _command(
        sub, "put", "Upload a local file (or - for stdin) into the store.", _transfer.put
    )
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
    parser.set_defaults(
        interrupted="a file not uploaded whole is not written; the chunks it sent are "
        "removed by graben fsck --collect once older than the grace period (1 h)"
    )


def add_get(sub: Subparsers) -> None:
    """``graben get REMOTE LOCAL [--exclusive] [-r]``."""
    parser = _command(
        sub, "get", "Download a file from the store (LOCAL - for stdout).", _transfer.get
    )
    parser.add_argument("remote", help=_PATH_HELP)
    parser.add_argument(
        "local",
        help="local file or directory (an existing one, or a trailing /, gets the remote "
        "name), or - for stdout; each file written whole or not at all",
    )
    parser.add_argument(
        "-x",
        "--exclusive",
        action="store_true",
        help="fail, before writing anything, if a local file would be replaced",
    )
    parser.add_argument(
        "-r", "--recursive", action="store_true", help="download a store directory tree"
    )
    parser.set_defaults(interrupted="a local file not downloaded whole is not written")


def add_cp(sub: Subparsers) -> None:
    """``graben cp SRC DST [--no-clobber] [-r]``."""
    summary = "Copy a file or tree inside the store: the copy shares the chunks, no byte moves."
    parser = _command(sub, "cp", summary, _trees.cp)
    parser.add_argument("src", help=_PATH_HELP)
    parser.add_argument(
        "dst", help="destination path; an existing directory (or a trailing /) gets SRC's name"
    )
    parser.add_argument(
        "-n", "--no-clobber", action="store_true", help="fail instead of replacing a file"
    )
    parser.add_argument("-r", "--recursive", action="store_true", help="copy a directory tree")


def add_fsck(sub: Subparsers) -> None:
    """``graben fsck [--collect [--grace SECONDS] [--force]] [--json]``."""
    summary = (
        "Re-read and verify every chunk and the metadata; "
        "exit 1 if anything is missing, corrupt or inconsistent, or if a data node is dead "
        "(its copies go unchecked, the rest are checked, and it is named)."
    )
    parser = _command(sub, "fsck", summary, _fsck)
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="list every leftover, not only their count"
    )
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


# --- namespace commands ---------------------------------------------------------------


def _ls(args: argparse.Namespace) -> int:
    store, (path,) = locate(args.store, args.path)
    with open_client(store, args) as client:
        infos = client.ls(path)
        state = client.storage_class(path) if args.long and not args.json else None
    if args.json:
        out.emit_json(infos)
        return 0
    # ``ls -l`` leads with the class in force, as ``ls -l`` leads with a total.
    heading = [f"class {out.class_text(state)}"] if state is not None and state.name else []
    out.emit_lines(heading + out.ls_lines(infos, normalize(path), long=args.long, human=args.human))
    return 0


def _stat(args: argparse.Namespace) -> int:
    store, (path,) = locate(args.store, args.path)
    with open_client(store, args) as client:
        info = client.stat(path)
        state = client.storage_class(path)
    if args.json:
        out.emit_json({**msgspec.structs.asdict(info), "storage_class": state})
    else:
        out.emit_lines([*out.stat_lines(info), f"{'class':<12} {out.class_text(state)}"])
    return 0


def _du(args: argparse.Namespace) -> int:
    store, (path,) = locate(args.store, args.path)
    with open_client(store, args) as client:
        files, size = client.du(path)
        held, chunks = _trees.physical(client, path) if args.physical else (size, 0)
    clean = normalize(path)
    if args.json:
        extra = {"physical_bytes": held, "chunks": chunks} if args.physical else {}
        out.emit_json({"path": clean, "files": files, "bytes": size, **extra})
    else:
        out.emit_lines([out.du_line(clean, files, held, human=args.human)])
    return 0


def _mkdir(args: argparse.Namespace) -> int:
    store, (path,) = locate(args.store, args.path)
    with open_client(store, args, create=True) as client:
        client.mkdir(path, parents=args.parents, exist_ok=args.parents)
    return 0


def _rm(args: argparse.Namespace) -> int:
    store, (path,) = locate(args.store, args.path)
    with open_client(store, args) as client:
        try:
            client.rm(path, recursive=args.recursive)
        except DirectoryNotEmpty:
            # The store's message speaks of a keyword argument; name the flag.
            raise DirectoryNotEmpty(
                "directory not empty (use rm -r to remove it and everything in it)", path
            ) from None
    return 0


def _mv(args: argparse.Namespace) -> int:
    store, (src, dst) = locate(args.store, args.src, args.dst)
    with open_client(store, args) as client:
        dest = remote_dest(client, dst, posixpath.basename(normalize(src)))
        client.rename(src, dest, replace=not args.no_clobber)
    return 0


def _fsck(args: argparse.Namespace) -> int:
    with open_client(args.store, args) as client:
        allowed = out.progress_allowed(json=args.json)
        with out.Meter("fsck", None, enabled=allowed) as meter:
            report = client.fsck(
                collect=args.collect, grace=args.grace, force=args.force, progress=meter
            )
    if args.json:
        out.emit_json(out.fsck_json(report))
    else:
        out.emit_lines(out.fsck_lines(report, verbose=args.verbose))
    return 0 if report.ok else 1
