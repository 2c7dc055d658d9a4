"""``graben class set|show|clear``: storage classes on store paths.

A class set on a directory rules every file below it that has none nearer
(``store/_classes/_names.py`` says what the names mean); the leading metadata
service converts their chunks in the background, once each file is
unchanged for the class's age.
"""

from __future__ import annotations

import argparse
import sys

from .._classes import parse
from .._paths import normalize
from . import _render as out
from ._cmds import Subparsers, _command, _json_flag
from ._stores import locate, open_client

_CLASS_HELP = (
    "ec:K+M (K data, M parity pieces per chunk; e.g. ec:6+3), or replicated (kept as "
    "written), optionally @AGE: convert files unchanged that long (ec:6+3@1h)"
)


def add_class(sub: Subparsers) -> None:
    """``graben class set PATH CLASS``, ``graben class show PATH``, ``graben class clear PATH``."""
    parser = sub.add_parser(
        "class",
        help="Set or show the storage class of a path.",
        description="Set or show the storage class of a directory or file.",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    put = _command(actions, "set", "Set the storage class of a directory or file.", _set)
    put.add_argument("path", help="store path")
    put.add_argument("storage_class", metavar="CLASS", help=_CLASS_HELP)
    show = _command(actions, "show", "Show the class in force at a path.", _show)
    show.add_argument("path", help="store path")
    _json_flag(show)
    clear = _command(actions, "clear", "Remove the class set on a path.", _clear)
    clear.add_argument("path", help="store path")


def _set(args: argparse.Namespace) -> int:
    store, (path,) = locate(args.store, args.path)
    with open_client(store, args) as client:
        name = client.set_class(path, args.storage_class)
        up = sum(n.alive for n in client.health().nodes)
    out.emit_lines([f"{out.shown(normalize(path))}: {name}"])
    target = parse(name)
    if target.kind == "ec" and up < target.k + target.m:
        print(
            f"graben: note: {name} needs {target.k + target.m} data nodes up and this store "
            f"has {up}: its files stay as written until it has",
            file=sys.stderr,
        )
    return 0


def _clear(args: argparse.Namespace) -> int:
    store, (path,) = locate(args.store, args.path)
    with open_client(store, args) as client:
        client.set_class(path, "")
    return 0


def _show(args: argparse.Namespace) -> int:
    store, (path,) = locate(args.store, args.path)
    with open_client(store, args) as client:
        state = client.storage_class(path)
    if args.json:
        out.emit_json(state)
    else:
        out.emit_lines([out.class_text(state)])
    return 0
