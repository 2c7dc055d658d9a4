"""The write path of the namespace: where new chunks go, and committing files.

``Commits`` is the half of ``Namespace`` that places chunks (``prepare``)
and makes files visible (``commit``, and ``commit_group`` for the metadata
service's group commit: many clients' batches in one engine transaction).
``Namespace`` inherits it and sets the attributes it declares.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from .. import _paths
from .._errors import AlreadyExists, GrabenError, IntegrityError, InvalidArgument, IsADirectory
from .._types import ChunkRef, Extent, FileCommit, FileInfo, Placement
from ._once import record, recorded, replayed, write_once
from ._repo import NewFile, Repository, Tx
from ._walk import Directories, ensure_dirs, info

Placer = Callable[[ChunkRef, int, int, tuple[str, ...]], tuple[str, ...]]
"""(chunk, replication, fewest acceptable, nodes to avoid) -> the nodes to store it on."""
PERMISSION_BITS = 0o7777
"""What a new version keeps of the mode of the one it replaces (not a symlink's type bits)."""
FILE_MODE = 0o644


class Commits:
    """Placing chunks and committing files over a repository (see ``Namespace``, which
    sets the attributes below)."""

    repo: Repository
    """The engine."""
    _place: Placer
    """Where a new chunk's copies go."""
    default_replication: int
    """Copies of each chunk unless a file asks otherwise."""
    min_replicas: int
    """Copies a write needs at least (0: one fewer than it asks for, at least 1)."""

    def prepare(
        self,
        chunks: tuple[ChunkRef, ...],
        replication: int,
        avoid: tuple[str, ...] = (),
        min_replicas: int = 0,
    ) -> list[Placement]:
        """For each chunk: skip it if a live file already uses it, else where to send it.

        With too few live nodes for every copy, a placement names as many as
        there are, down to the write's minimum (``Placement.minimum``).
        """
        copies = self._replication(replication)
        least = self._minimum(copies, min_replicas)
        with self.repo.read() as tx:
            held = tx.referenced(c.id for c in chunks)
        return [
            Placement(c, False, held[c.id], minimum=least)
            if c.id in held
            else Placement(c, True, self._place(c, copies, least, avoid), minimum=least)
            for c in chunks
        ]

    def _minimum(self, copies: int, asked: int) -> int:
        """Copies a write of ``copies`` needs: asked, else the store's, else one fewer."""
        if asked < 0:
            raise InvalidArgument(f"min_replicas must be at least 1, not {asked}")
        least = asked or self.min_replicas or copies - 1
        return max(1, min(least, copies))

    def _replication(self, asked: int) -> int:
        if asked < 0:
            raise InvalidArgument(f"replication must be at least 1, not {asked}")
        return asked or self.default_replication

    def commit(self, files: tuple[FileCommit, ...], *, key: str = "") -> list[FileInfo]:
        """Make each file visible; all of the batch or none of it."""
        known: Directories = {}
        return write_once(
            self.repo,
            key,
            list[FileInfo],
            lambda tx: [self._commit_one(tx, f, known) for f in files],
        )

    def commit_group(
        self, batches: Sequence[tuple[FileCommit, ...]], keys: Sequence[str] = ()
    ) -> list[list[FileInfo] | GrabenError]:
        """Commit independent batches in one transaction (one fsync for all).

        Each batch is all or nothing, as with ``commit``; a batch that fails
        gets its error in its place and leaves the others alone. ``keys``
        (one per batch, ``""`` for none) are recorded in the same transaction
        with each committed batch's reply; a batch whose key is recorded
        already gets that reply and is not committed again.

        Batches rarely fail, so they go together first, without a savepoint
        each (two round trips per batch on PostgreSQL). If one fails, that
        transaction is rolled back whole and the group goes again, each batch
        in a savepoint of its own.
        """
        keys = list(keys) or [""] * len(batches)
        if len(batches) > 1:
            try:
                return self._commit_keyed(batches, keys, together=True)
            except _BatchFailed:
                pass
        return self._commit_keyed(batches, keys, together=False)

    def _commit_keyed(
        self, batches: Sequence[tuple[FileCommit, ...]], keys: Sequence[str], *, together: bool
    ) -> list[list[FileInfo] | GrabenError]:
        results: list[list[FileInfo] | GrabenError] = []
        with self.repo.write() as tx:
            done = recorded(tx, keys)
            fresh: dict[str, list[FileInfo]] = {}  # a key twice in one group: applied once
            known: Directories = {}
            for files, key in zip(batches, keys, strict=True):
                if key in done:
                    results.append(replayed(done[key], list[FileInfo], key))
                elif key in fresh:
                    results.append(fresh[key])
                else:
                    results.append(self._commit_batch(tx, files, known, together))
                    if key and isinstance(results[-1], list):
                        fresh[key] = results[-1]
            if fresh:
                record(tx, list(fresh.items()))
        return results

    def _commit_batch(
        self, tx: Tx, files: tuple[FileCommit, ...], known: Directories, together: bool
    ) -> list[FileInfo] | GrabenError:
        """One batch of a group: its files, or the error that undid it (``together``: no
        savepoint; a failure raises ``_BatchFailed``, undoing the whole group)."""
        if together:
            try:
                return [self._commit_one(tx, f, known) for f in files]
            except GrabenError as exc:
                raise _BatchFailed from exc  # out of the block: the transaction rolls back
        try:
            with tx.savepoint():
                return [self._commit_one(tx, f, known) for f in files]
        except GrabenError as exc:
            known.clear()  # directories it made were rolled back with it
            return exc

    def _commit_one(self, tx: Tx, commit: FileCommit, known: Directories) -> FileInfo:
        parts = _paths.split(commit.path)
        clean = _paths.join_parts(parts)
        if not parts:
            raise IsADirectory("cannot write to the root", clean)
        size = _check_extents(commit.extents, clean)
        tx.add_chunks((s.chunk, s.nodes) for s in commit.stored)
        # What the commit stores itself is known now; only chunks it reuses are asked for.
        missing = {x.chunk.id for x in commit.extents} - {s.chunk.id for s in commit.stored}
        if missing:
            missing -= tx.known(missing)
        if missing:
            raise IntegrityError(
                f"commit names {len(missing)} chunk(s) the store does not hold "
                f"(collected while the writer was open?): {sorted(missing)[0]}",
                clean,
            )
        parent = ensure_dirs(tx, parts[:-1], commit.path, known)
        old = tx.lookup(parent.id, parts[-1])
        if old is not None and commit.mode == "create":
            raise AlreadyExists("file exists", clean)
        if old is not None and old.kind == "directory":
            raise IsADirectory("a directory has this name", clean)
        generation = 1 if old is None else old.generation + 1
        copies = self._replication(commit.replication)
        mode = commit.permissions or (FILE_MODE if old is None else old.mode & PERMISSION_BITS)
        if old is not None:
            tx.unlink(parent.id, parts[-1])
        new = NewFile(size, mode, time.time_ns(), generation, copies, commit.extents)
        node = tx.create_file(parent.id, parts[-1], new)
        if old is not None:  # after the new one is numbered: SQLite would reuse its number
            tx.delete(old.id)
        return info(clean, node)


class _BatchFailed(Exception):
    """A batch of a group committed together failed: the group goes again, apart."""


def _check_extents(extents: tuple[Extent, ...], path: str) -> int:
    """Extents must tile the file from 0 without gaps; returns the size."""
    size = 0
    for extent in extents:
        if extent.offset != size or extent.length <= 0:
            raise InvalidArgument(f"extents do not tile the file at offset {size}", path)
        if extent.chunk_offset < 0 or extent.chunk_offset + extent.length > extent.chunk.length:
            raise InvalidArgument(f"extent at {size} overruns its chunk", path)
        size += extent.length
    return size
