"""One client per store per process, for every door: ``shared_client``.

A job that saves checkpoints through DCP, reads its dataset through
``graben://`` and lists runs with ``fsspec`` would otherwise hold a client
(threads, connections, buffers) per door per store. Like fsspec's instance
cache, the registry is keyed by what the client is made from (the store a
URL resolves to, after the environment, and the options), can be skipped
(``connect`` makes a private client) and cleared. A forked child makes its
own on first use; the parent's are left alone.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading

from .._config import Options, Target, resolve
from ._client import Client

_lock = threading.Lock()
_clients: dict[tuple[int, Target, Options], Client] = {}


def shared_client(url: str | os.PathLike[str] | None = None, **options: object) -> Client:
    """The process's client for the store ``url`` names with these ``options`` (as for
    ``connect``), made on first use and closed at exit.

    Other parts of the program use it too: closed anyway, the next call makes
    another. ``clear_shared_clients`` closes them all; ``connect`` makes a
    client of your own.
    """
    key = (os.getpid(), resolve(url), Options(**options))  # type: ignore[arg-type]
    with _lock:
        client = _clients.get(key)
        if client is None or client.closed:
            client = _clients[key] = Client(url, **options)
        return client


@atexit.register
def clear_shared_clients() -> None:
    """Close and forget this process's shared clients (the next ``shared_client`` call
    makes a new one).

    Run at exit too, while Python is whole: a client left to interpreter
    teardown leaves its loop, threads and buffers to be torn down with it,
    where C++ threads (torch's, gloo's, arrow's) that still hold its memory
    can take the process down.
    """
    with _lock:
        mine = [c for key, c in _clients.items() if key[0] == os.getpid()]
        _clients.clear()
    for client in mine:
        with contextlib.suppress(Exception):  # a store that went away: nothing to release
            client.close()
