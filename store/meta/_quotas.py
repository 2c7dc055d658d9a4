"""Quotas: the files, bytes and bytes on disk a directory's tree may hold.

A quota is a row of its own, keyed by
the directory's path (a tenant's quota is its root's), carrying the usage of
the tree below it. Every transaction that changes the tree moves that usage
by its own change (``charge``: a commit adds a file's bytes and takes away
the version it replaces; a removal takes away what it frees), under the row's
lock, and refuses the change with ``QuotaExceeded`` if it takes the usage
past a limit: the total never passes the quota, whatever many writers do at
once. Before a chunk is sent, ``check_room`` refuses it when the committed
usage plus the file's bytes so far already leave no room for it.

Each file is charged its logical size, and on disk its size times its copies
(a small file the engine keeps: its size once), whether or not its chunks are
shared with other files (deduplicated): a tenant pays as if alone, a ``rm``
gives back what its write took, and no one learns from their usage whether
someone else stores the same bytes.

A file never moves from under one set of quotas to another: a rename or hard
link across a quota's boundary is ``CrossDevice`` (EXDEV, as Linux's project
quotas do), and ``mv`` copies instead. A directory holding quotas may move
within its quotas; its quotas move with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from .. import _paths
from .._errors import CrossDevice, InvalidArgument, NotADirectory, QuotaExceeded
from .._types import ChunkRef, QuotaState
from ..transport import GetQuotas, SetQuota, Usage
from ._idempotency import write_once
from ._operations import handles
from ._policy import Policy
from ._repo import Inode, Repository, Tx
from ._walk import resolve

Delta = tuple[str, int, int, int]
"""A file's change to its quotas: its path, files, bytes, bytes on disk."""


def above(path: str) -> list[str]:
    """The directories above a normalised path, the root first (not the path itself)."""
    parts = _paths.split(path)
    return [_paths.join_parts(parts[:depth]) for depth in range(len(parts))]


class Quotas:
    """Quota operations over a repository; what a small file takes on disk follows
    ``policy``'s ``inline_max``."""

    def __init__(self, repo: Repository, policy: Policy) -> None:
        self.repo = repo
        self._policy = policy

    def physical(self, size: int, copies: int) -> int:
        """What a file of ``size`` bytes and ``copies`` copies takes on disk."""
        return size if size <= self._policy.inline_max else size * copies

    def charge(self, tx: Tx, deltas: Iterable[Delta]) -> None:
        """Add each file's change to the quotas above it; ``QuotaExceeded`` (and the
        transaction undone) if one goes past a limit."""
        changes = [d for d in deltas if any(d[1:])]
        if not changes:
            return
        over = {path: above(path) for path, *_ in changes}
        quotas = {q.path for q in tx.quotas.quotas({d for dirs in over.values() for d in dirs})}
        totals: dict[str, list[int]] = {}
        first: dict[str, str] = {}
        for path, *delta in changes:
            for directory in over[path]:
                if directory in quotas:
                    total = totals.setdefault(directory, [0, 0, 0])
                    total[:] = [t + d for t, d in zip(total, delta, strict=True)]
                    first.setdefault(directory, path)
        for directory in sorted(totals):  # one order for every writer: none waits in a ring
            files, size, physical = totals[directory]
            after = tx.quotas.add_usage(directory, files, size, physical)
            if after is not None:
                used = (after.files, after.bytes, after.physical)
                _refuse_over(after, used, (files, size, physical), first[directory])

    def check_room(
        self,
        tx: Tx,
        chunks: Sequence[ChunkRef],
        paths: Sequence[str],
        sent: Sequence[int],
        copies: int,
    ) -> None:
        """``QuotaExceeded`` if a chunk of a file (its path, and the file's bytes before
        it) kept in ``copies`` copies would not fit its quotas as they are committed now:
        before it is sent."""
        if not paths:
            return
        if len(paths) != len(chunks) or len(sent) != len(chunks):
            raise InvalidArgument(f"{len(chunks)} chunks to place with {len(paths)} paths")
        clean = [_paths.normalize(p) for p in paths]
        quotas = {q.path: q for q in tx.quotas.quotas({d for p in clean for d in above(p)})}
        if not quotas:
            return
        for ref, path, before in zip(chunks, clean, sent, strict=True):
            size = before + ref.length
            disk = self.physical(size, copies)
            for directory in above(path):
                if (q := quotas.get(directory)) is not None:
                    used = (q.files, q.bytes + size, q.physical + disk)
                    _refuse_over(q, used, (0, size, disk), path)

    def check_move(self, tx: Tx, src: str, dst: str, node: Inode) -> None:
        """``CrossDevice`` unless ``src`` and ``dst`` are under the same quotas; a
        directory's own quotas go with it."""
        froms, tos = set(above(src)), set(above(dst))
        quotas = {q.path for q in tx.quotas.quotas(froms | tos)}
        if quotas & froms != quotas & tos:
            raise CrossDevice(
                f"{src} and {dst} are under different quotas "
                f"({', '.join(sorted(quotas & (froms ^ tos)))}): copy, then remove",
                dst,
            )
        if node.kind == "directory":
            tx.quotas.move_quotas(src, dst)

    def release(self, tx: Tx, path: str, freed: tuple[int, int, int], directory: bool) -> None:
        """What a removal at ``path`` freed goes back to the quotas above it; a removed
        directory's own quotas go with it."""
        if directory:
            tx.quotas.drop_quotas(path)
        self.charge(tx, [(path, -freed[0], -freed[1], -freed[2])])

    @handles(SetQuota)
    def set_quota(
        self,
        path: str,
        max_bytes: int,
        max_physical: int,
        max_files: int,
        *,
        tenant: str = "",
        key: str = "",
    ) -> QuotaState:
        """Set the quota of a directory (0: no limit of that kind), counting what its tree
        holds now; all three 0: clear it (a tenant's root keeps its row, to count)."""
        for what, value in (("bytes", max_bytes), ("physical", max_physical), ("files", max_files)):
            if value < 0:
                raise InvalidArgument(f"a quota's {what} is 0 (no limit) or more, not {value}")
        parts = _paths.split(path)
        clean = _paths.join_parts(parts)

        def apply(tx: Tx) -> QuotaState:
            node = resolve(tx, parts, clean)
            if node.kind != "directory":
                raise NotADirectory("a quota is set on a directory", clean)
            was = tx.quotas.quotas([clean])
            owner = tenant or (was[0].tenant if was else "")
            if not (max_bytes or max_physical or max_files or owner):
                tx.quotas.drop_quotas(clean, tree=False)
                return QuotaState(clean, "", 0, 0, 0, 0, 0, 0)
            files, size, physical = self._tree(tx, node)
            quota = QuotaState(
                clean, owner, max_bytes, max_physical, max_files, size, physical, files
            )
            tx.quotas.set_quota(quota)
            return quota

        return write_once(self.repo, key, QuotaState, apply)

    @handles(Usage)
    def usage(self, path: str) -> tuple[int, int]:
        """(files, bytes) at or below a path, each name counted."""
        parts = _paths.split(path)
        with self.repo.read() as tx:
            sizes = [node.size for node in _files(tx, resolve(tx, parts, path))]
        return len(sizes), sum(sizes)

    def held(self, node: Inode) -> tuple[int, int, int]:
        """What a file holds against its quotas: one file, its bytes, its bytes on disk."""
        return 1, node.size, self.physical(node.size, node.replication)

    def replaced(self, path: str, new: Inode, old: Inode | None) -> Delta:
        """A commit's change to its quotas: ``new`` at ``path`` in place of ``old``."""
        now, was = self.held(new), self.held(old) if old is not None else (0, 0, 0)
        return path, now[0] - was[0], now[1] - was[1], now[2] - was[2]

    @handles(GetQuotas)
    def quotas_of(self, path: str) -> list[QuotaState]:
        """The quotas above, at and below ``path`` (every one: ``""``)."""
        with self.repo.read() as tx:
            if not path:
                return tx.quotas.quotas()
            clean = _paths.normalize(path)
            return tx.quotas.quotas(above(clean)) + tx.quotas.quotas_within(clean)

    def _tree(self, tx: Tx, node: Inode) -> tuple[int, int, int]:
        """(files, bytes, bytes on disk) at and below ``node``, each file once."""
        once = {file.id: file for file in _files(tx, node)}.values()  # hard links: one file
        held = [self.held(file) for file in once]
        return len(held), sum(h[1] for h in held), sum(h[2] for h in held)


def _files(tx: Tx, node: Inode) -> Iterator[Inode]:
    """The file at each name at and below ``node`` (a file with two names: twice)."""
    pending = [node]
    while pending:
        current = pending.pop()
        if current.kind == "file":
            yield current
        else:
            pending.extend(child for _, child in tx.tree.children(current.id))


def _refuse_over(
    quota: QuotaState, used: tuple[int, int, int], grows: tuple[int, int, int], path: str
) -> None:
    """``QuotaExceeded`` if ``used`` (files, bytes, bytes on disk) is past one of
    ``quota``'s limits that it is growing towards."""
    limits = (quota.max_files, quota.max_bytes, quota.max_physical)
    for what, now, growth, limit in zip(_KINDS, used, grows, limits, strict=True):
        if limit and growth > 0 and now > limit:
            owner = (
                f"tenant {quota.tenant}'s quota at {quota.path}"
                if quota.tenant
                else f"the quota of {quota.path}"
            )
            raise QuotaExceeded(f"{owner} allows {limit:,} {what}; this write needs {now:,}", path)


_KINDS = ("files", "bytes", "bytes on disk")
