"""Which store a command's arguments name, and the plumbing every command shares.

A path may be a ``graben://host:port/path`` URL naming its store; it must
agree with ``--store`` and with the other paths. Local-disk errors become
store errors, so the dispatcher prints them as one line.
"""

from __future__ import annotations

import argparse
import os
import posixpath
from collections.abc import Iterator
from contextlib import contextmanager

from .._config import resolve, split_url
from .._errors import GrabenError, InvalidArgument, NotADirectory, NotFound, from_os_error
from ..client import Client, connect, store_made
from ._tls import client_tls


def locate(flag: str | None, *paths: str) -> tuple[str | None, list[str]]:
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


def timeout_arg(parser: argparse.ArgumentParser) -> None:
    """``--timeout SECONDS``: how long a client command retries a service it lost;
    ``--wait SECONDS``: how long it tries to reach one it never reached."""
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="give up retrying an unreachable metadata service after this long (default 30)",
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=None,
        metavar="SECONDS",
        help="keep trying to reach a cluster that is starting for this long (default 1)",
    )


@contextmanager
def open_client(
    store: str | None, args: argparse.Namespace, *, create: bool = False
) -> Iterator[Client]:
    """A client of ``store`` as the command's ``--timeout``, ``--wait`` and ``--tls-*``
    flags say; commands that only read refuse to create a store.

    Opening an embedded store creates its directory, so a mistyped
    ``--store`` on ``ls`` would otherwise leave a new empty store behind.
    """
    if not create:
        _require_store(store)
    options = {k: v for k in ("timeout", "wait") if (v := getattr(args, k, None)) is not None}
    with connect(store, tls=client_tls(args), **options) as client:
        yield client


def _require_store(store: str | None) -> None:
    home = resolve(store).embedded
    if home is not None and not store_made(home):  # missing, or an empty directory
        raise NotFound("no store here (put or mkdir creates one)", str(home))


def remote_is_dir(client: Client, path: str) -> bool:
    try:
        return client.stat(path).is_dir
    except (NotFound, NotADirectory):
        return False


def remote_dest(client: Client, path: str, name: str) -> str:
    """``path``, or ``path/name`` if it ends with ``/`` or is an existing directory."""
    if path.endswith("/") or remote_is_dir(client, path):
        return posixpath.join(path, name)
    return path


@contextmanager
def local_errors(path: str | os.PathLike[str]) -> Iterator[None]:
    """Report local-disk failures as store errors, so the dispatcher prints one line."""
    try:
        yield
    except GrabenError:  # some are OSErrors too; they are already what we want
        raise
    except OSError as exc:
        error = from_os_error(exc, os.fspath(path))
        raise type(error)(f"{exc.strerror or exc} (local)", os.fspath(path)) from exc
