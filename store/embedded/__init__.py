"""The embedded store: the metadata logic and a chunk store in one process.

Owns the in-process side of the transport seam (``_store``: ``LocalMeta``
runs ``meta``'s namespace logic on one thread, ``LocalChunks`` serves
``node``'s chunk store from a small pool) and the layout of an embedded
store's directory. No server, no socket: what a single machine needs.

May import: ``meta``, ``node``, ``transport``, ``wire`` and the store's
shared modules; never the ``client`` or anything above it.
"""

from ._store import LocalChunks, LocalMeta, health_before_made, open_store

__all__ = ["LocalChunks", "LocalMeta", "health_before_made", "open_store"]
