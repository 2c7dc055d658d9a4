"""DCP storage on a graben store: the protocol, and what the writer and the reader share.

``GrabenWriter`` (``_writer``) and ``GrabenReader`` (``_reader``) each name a
checkpoint by URL (``OnStore``) and use the store's shared client
(``graben.store.shared_client``) unless they are given one.

Save (DCP calls, in order: ``reset``, ``set_up_storage_writer``,
``prepare_local_plan``, ``prepare_global_plan`` on the coordinator,
``write_data`` on every rank, ``finish`` on the coordinator):

- the coordinator names one staging directory beside the checkpoint
  (``.NAME.saving-ID``) and hands it to every rank with its plan, with the
  digest of that rank's write results it still holds from the last save;
- each rank writes its items into one file there, tensors straight from
  their memory, plus an index (where each tensor's bytes start, crc32c) and
  its part of the metadata (``_ranked``), stored and not committed; it sends
  the coordinator those files and its results, or only their digest when the
  coordinator holds them;
- ``finish`` commits every rank's files, ``.metadata`` (the last save's bytes
  when nothing changed) and the directory of keys, and renames the staging
  directory onto the checkpoint, in one transaction. Until then nothing is visible;
  a crash leaves the previous checkpoint as it was, and an overwrite
  replaces the old tree in the same transaction.

Load reads the directory and, as planning asks (``GrabenLoadPlanner``), the
metadata of the rank files it needs, else ``.metadata`` whole; then for each
item only the bytes it needs: a tensor whose saved chunk matches the target
is read straight into the target's memory; a resharded one reads just the
rows that overlap.
"""

from __future__ import annotations

import os

from graben.store import Client, InvalidArgument, shared_client, split_url

METADATA = ".metadata"
SUFFIX = ".distcp"


def store_and_path(checkpoint_id: str | os.PathLike[str]) -> tuple[str | None, str]:
    url = os.fspath(checkpoint_id)
    store, path = split_url(url)
    if path in ("", "/"):
        raise InvalidArgument("a checkpoint needs a directory below the root", url)
    return store, path.rstrip("/")


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
