"""DCP storage on a graben store: the protocol, and what the writer and the reader share.

``GrabenWriter`` (``_writer``) and ``GrabenReader`` (``_reader``) each name a
checkpoint by URL (``OnStore``) and use one client per store per process
(``shared_client``) unless they are given one.

Save (DCP calls, in order: ``reset``, ``set_up_storage_writer``,
``prepare_local_plan``, ``prepare_global_plan`` on the coordinator,
``write_data`` on every rank, ``finish`` on the coordinator):

- the coordinator names one staging directory beside the checkpoint
  (``.NAME.saving-ID``) and hands it to every rank with its plan, with the
  digest of that rank's write results it still holds from the last save;
- each rank writes its items into one file there, tensors straight from
  their memory, plus an index (where each tensor's bytes start, crc32c) and
  its part of the metadata (``_ranked``); it sends the coordinator its
  results, or only their digest when the coordinator holds them;
- ``finish`` writes ``.metadata`` (the last save's bytes when nothing
  changed) and the directory of keys into the staging directory and renames
  it onto the checkpoint in one transaction. Until then nothing is visible;
  a crash leaves the previous checkpoint as it was, and an overwrite
  replaces the old tree in the same transaction.

Load reads the directory and, as planning asks (``GrabenLoadPlanner``), the
metadata of the rank files it needs, else ``.metadata`` whole; then for each
item only the bytes it needs: a tensor whose saved chunk matches the target
is read straight into the target's memory; a resharded one reads just the
rows that overlap.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading

from graben.store import Client, InvalidArgument, connect, split_url

METADATA = ".metadata"
SUFFIX = ".distcp"


def store_and_path(checkpoint_id: str | os.PathLike[str]) -> tuple[str | None, str]:
    url = os.fspath(checkpoint_id)
    store, path = split_url(url)
    if path in ("", "/"):
        raise InvalidArgument("a checkpoint needs a directory below the root", url)
    return store, path.rstrip("/")


_shared_clients: dict[tuple[object, ...], Client] = {}
_shared_lock = threading.Lock()


def shared_client(store: str | None) -> Client:
    """One client per store per process, for every writer and reader without one.

    A job saving each step with ``GrabenWriter(url)`` would otherwise open a
    client (threads, connections, buffers) per step, pay for it in the save
    and never close it. The default store's key includes the environment
    that names it; a forked child makes its own.
    """
    key = (os.getpid(), store, os.environ.get("GRABEN_URL"), os.environ.get("GRABEN_HOME"))
    with _shared_lock:
        client = _shared_clients.get(key)
        if client is None:
            client = _shared_clients[key] = connect(store)
        return client


@atexit.register
def _close_shared_clients() -> None:
    # While Python is whole: a client left open to interpreter exit leaves its
    # loop, threads and buffers to be torn down with it, where C++ threads of
    # torch or gloo that still hold its memory can take the process down.
    with _shared_lock:
        mine = [c for key, c in _shared_clients.items() if key[0] == os.getpid()]
        _shared_clients.clear()
    for client in mine:
        with contextlib.suppress(Exception):  # exiting: nothing left to tell
            client.close()


class OnStore:
    """A checkpoint URL and the client for the store it names (shared unless one is given)."""

    def __init__(self, checkpoint_id: str | os.PathLike[str], client: Client | None) -> None:
        self._client = client
        self._store: str | None = None
        self._url, self.path = "", ""
        self._repoint(checkpoint_id)

    def _repoint(self, checkpoint_id: str | os.PathLike[str] | None) -> None:
        if not checkpoint_id:
            return
        self._store, self.path = store_and_path(checkpoint_id)
        self._url = os.fspath(checkpoint_id)

    @property
    def checkpoint_id(self) -> str:
        """The checkpoint's URL."""
        return self._url

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        """Whether DCP should pick this class for ``checkpoint_id``: a ``graben:`` URL."""
        return os.fspath(checkpoint_id).startswith("graben:")

    @property
    def client(self) -> Client:
        """The client given, else the process's shared one for this store."""
        return self._client if self._client is not None else shared_client(self._store)
