"""The write path of the namespace: where new chunks go, and committing files.

``Commits`` places chunks (``prepare``) and makes files visible
(``commit``, and ``commit_group`` for the metadata service's group commit:
many clients' batches in one engine transaction), charging each file to its
quotas (``Quotas``).
"""

from __future__ import annotations

import math
import stat
import time
from collections.abc import Callable, Sequence

from .. import _paths
from .._errors import AlreadyExists, GrabenError, IntegrityError, InvalidArgument, IsADirectory
from .._hashing import content_id, crc32c
from .._types import ChunkRef, Extent, FileCommit, FileInfo, StoredChunk
from ..transport import Commit, GetSettings, Placement, Prepare, Settings
from ..wire import auth
from ._changes import changed_rows
from ._idempotency import bind, key_id, misused, record, recorded, replayed_or_error, write_once
from ._operations import handles
from ._policy import Policy
from ._quotas import Quotas
from ._repo import Inode, NewFile, Repository, Tx, encrypted
from ._walk import Directories, ensure_dirs, info

Touched = dict[int, int]
"""Directories that gained a file in a transaction: inode -> the time their entries changed."""
Reached = Callable[[Tx, Sequence[str]], set[str]]
"""(transaction, chunk ids) -> those of them a tenant's scope reaches (a file it reaches
uses them)."""
Placer = Callable[[ChunkRef, int, int, tuple[str, ...]], tuple[str, ...]]
"""(chunk, replication, fewest acceptable, nodes to avoid) -> the nodes to store it on."""
PERMISSION_BITS = 0o7777
"""What a new version keeps of the mode of the one it replaces (not a symlink's type bits)."""
FILE_MODE = 0o644
TYPES = frozenset(
    {0, stat.S_IFREG, stat.S_IFLNK, stat.S_IFIFO, stat.S_IFSOCK, stat.S_IFCHR, stat.S_IFBLK}
)
"""Type bits a file's mode may carry (0 and ``S_IFREG``: a regular file)."""
CONTENTLESS = frozenset({stat.S_IFIFO, stat.S_IFSOCK, stat.S_IFCHR, stat.S_IFBLK})
"""Types whose I/O the kernel does: names with attributes, never bytes."""
MAX_ID = 2**32 - 2
"""The largest user or group id (``(uid_t)-1`` means "none")."""
TIME_RANGE = range(-(2**63), 2**63)
"""Times the engines hold (ns since the epoch, 64-bit)."""


class Commits:
    """Placing chunks and committing files over a repository: new chunks' copies go where
    ``place`` says, each file is charged to ``quotas``."""

    def __init__(self, repo: Repository, policy: Policy, quotas: Quotas, place: Placer) -> None:
        self.repo = repo
        self._policy = policy
        self._quotas = quotas
        self._place = place

    @handles(GetSettings)
    def settings(self) -> Settings:
        """What a writer needs to know: how small a file the engine keeps inline."""
        return Settings(self._policy.inline_max)

    @handles(Prepare)
    def prepare(
        self,
        chunks: tuple[ChunkRef, ...],
        replication: int,
        avoid: tuple[str, ...] = (),
        min_replicas: int = 0,
        paths: Sequence[str] = (),
        sent: Sequence[int] = (),
        mine: Reached | None = None,
    ) -> list[Placement]:
        """For each chunk: skip it if a live file already uses it with at least the
        write's minimum of copies, else where to send it (for a chunk held with
        fewer, the nodes that would add the rest: a caller's durability request
        holds for bytes the store has already).

        With too few live nodes for every copy, a placement names as many as
        there are, down to the write's minimum (``Placement.minimum``).

        ``paths`` (each chunk's file) and ``sent`` (the file's bytes before it): a chunk
        that would take a quota past its limit is refused before it is sent.

        ``mine``: a tenant's writer sees as held only the chunks its scope reaches
        (which of these ids it reaches); the rest it uploads as if no file used them,
        so the reply tells it nothing of other tenants' bytes.
        """
        copies = self._replication(replication)
        least = self._minimum(copies, min_replicas)
        with self.repo.read() as tx:
            self._quotas.check_room(tx, chunks, paths, sent, copies)
            held = tx.chunks.referenced(c.id for c in chunks)
            if mine is not None and held:
                reached = mine(tx, sorted(held))
                held = {c: nodes for c, nodes in held.items() if c in reached}
        return [self._placement(c, held.get(c.id), copies, least, avoid) for c in chunks]

    def _placement(
        self,
        chunk: ChunkRef,
        held: tuple[str, ...] | None,
        copies: int,
        least: int,
        avoid: tuple[str, ...],
    ) -> Placement:
        if held is None:
            return Placement(chunk, True, self._place(chunk, copies, least, avoid), minimum=least)
        if not held or len(held) >= least:  # the engine keeps it, or enough nodes do
            return Placement(chunk, False, held, minimum=least)
        more, need = copies - len(held), least - len(held)
        return Placement(chunk, True, self._place(chunk, more, need, (*avoid, *held)), minimum=need)

    def _minimum(self, copies: int, asked: int) -> int:
        """Copies a write of ``copies`` needs: asked, else the store's, else one fewer."""
        if asked < 0:
            raise InvalidArgument(f"min_replicas must be at least 1, not {asked}")
        least = asked or self._policy.min_replicas or copies - 1
        return max(1, min(least, copies))

    def _replication(self, asked: int) -> int:
        if asked < 0:
            raise InvalidArgument(f"replication must be at least 1, not {asked}")
        return asked or self._policy.default_replication

    @handles(Commit)
    def commit(self, files: tuple[FileCommit, ...], *, key: str = "") -> list[FileInfo]:
        """Make each file visible; all of the batch or none of it."""

        bound = bind(key, files)
        return write_once(self.repo, bound, list[FileInfo], lambda tx: self.commit_in(tx, files))

    def commit_in(self, tx: Tx, files: Sequence[FileCommit]) -> list[FileInfo]:
        """``commit``'s work inside a transaction of the caller's (a write that commits
        files and does more at once)."""
        known: Directories = {}  # made afresh each run: a run again forgets the last
        touched: Touched = {}
        done = self._commit_files(tx, files, known, touched)
        _touch(tx, touched)
        return done

    def commit_group(
        self, batches: Sequence[tuple[FileCommit, ...]], keys: Sequence[str] = ()
    ) -> list[list[FileInfo] | GrabenError]:
        """Commit independent batches in one transaction (one fsync for all).

        Each batch is all or nothing, as with ``commit``; a batch that fails
        gets its error in its place and leaves the others alone. ``keys``
        (one per batch, ``""`` for none) are recorded in the same transaction
        with each committed batch's reply; a batch whose key is recorded
        already gets that reply and is not committed again, and a key twice
        in one group is applied once. A key is bound to its batch: sent before
        with another request, it fails that batch alone (``InvalidArgument``).

        Batches rarely fail, so all their files go together first, a
        statement per table for the whole group (``_commit_files``). If one
        fails, that transaction is rolled back whole and the group goes
        again, each batch in a savepoint of its own.
        """
        keys = (
            [bind(k, b) for k, b in zip(keys, batches, strict=True)]
            if keys
            else [""] * len(batches)
        )
        try:
            return self._commit_keyed(batches, keys, together=True)
        except _BatchFailed:
            return self._commit_keyed(batches, keys, together=False)

    def _commit_keyed(
        self, batches: Sequence[tuple[FileCommit, ...]], keys: Sequence[str], *, together: bool
    ) -> list[list[FileInfo] | GrabenError]:

        def apply(tx: Tx) -> list[list[FileInfo] | GrabenError]:
            done = recorded(tx, keys)
            ids = [key_id(key) for key in keys]  # the keys as sent, without their prints
            first: dict[str, int] = {}  # a key twice in one group: applied once
            todo = []
            for i, key in enumerate(keys):
                if ids[i] not in done and (not key or first.setdefault(ids[i], i) == i):
                    todo.append(i)
            known: Directories = {}
            touched: Touched = {}
            if together:
                applied = self._commit_together(tx, [batches[i] for i in todo], known, touched)
            else:
                applied = [self._commit_batch(tx, batches[i], known, touched) for i in todo]
            outcome = dict(zip(todo, applied, strict=True))
            results: list[list[FileInfo] | GrabenError] = []
            for i, key in enumerate(keys):
                if ids[i] in done:
                    results.append(replayed_or_error(done[ids[i]], list[FileInfo], key))
                elif i in outcome:
                    results.append(outcome[i])
                elif keys[first[ids[i]]] == key:
                    results.append(outcome[first[ids[i]]])
                else:
                    results.append(misused(key, "sent with two requests at once"))
            _touch(tx, touched)
            fresh: list[tuple[str, object]] = [
                (keys[i], r) for i, r in outcome.items() if keys[i] and isinstance(r, list)
            ]
            if fresh:
                record(tx, fresh)
            return results

        return self.repo.transact(apply)

    def _commit_together(
        self,
        tx: Tx,
        batches: list[tuple[FileCommit, ...]],
        known: Directories,
        touched: Touched,
    ) -> list[list[FileInfo] | GrabenError]:
        """Every batch's files at once, no savepoint; a failure raises ``_BatchFailed``,
        undoing the whole group."""
        try:
            infos = iter(self._commit_files(tx, [f for b in batches for f in b], known, touched))
        except GrabenError as exc:
            raise _BatchFailed from exc  # out of the block: the transaction rolls back
        return [[next(infos) for _ in batch] for batch in batches]

    def _commit_batch(
        self, tx: Tx, files: tuple[FileCommit, ...], known: Directories, touched: Touched
    ) -> list[FileInfo] | GrabenError:
        """One batch of a group in a savepoint of its own: its files, or the error that
        undid it."""
        before = dict(touched)
        try:
            with tx.savepoint():
                return self._commit_files(tx, files, known, touched)
        except GrabenError as exc:
            known.clear()  # directories it made were rolled back with it
            touched.clear()
            touched.update(before)  # and the directories it named files in are as they were
            return exc

    def _commit_files(
        self, tx: Tx, commits: Sequence[FileCommit], known: Directories, touched: Touched
    ) -> list[FileInfo]:
        """Commit files of distinct paths with a statement per table for all of them (one
        round trip each across a network), not per file. A path twice: one at a time, in
        order, each version replacing the last."""
        # A service that has not yet seen this store become encrypted (no node listed
        # since, as ``NodeRegistry.heed_sealing`` learns it) looks before it keeps a
        # file's bytes, which would be their only plaintext at rest.
        inline = any(s.data is not None for c in commits for s in c.stored)
        if self._policy.inline_max and inline and encrypted(tx.identity.sealed()):
            self._policy.inline_max = 0
        checked = [self._checked(commit) for commit in commits]
        if len({clean for _, clean, _ in checked}) < len(checked):
            return [info for c in commits for info in self._commit_files(tx, (c,), known, touched)]
        tx.chunks.add_chunks([s for c in commits for s in c.stored])
        _check_held(tx, commits, checked)
        names = []
        for commit, (parts, _, _) in zip(commits, checked, strict=True):
            parent = ensure_dirs(tx, parts[:-1], commit.path, known)
            names.append((parent.id, parts[-1]))
        olds = tx.tree.locked_entries(names)  # their modes, owners and names carry over
        now = time.time_ns()
        made = []
        for commit, (_, clean, size), name in zip(commits, checked, names, strict=True):
            old = olds.get(name)
            if old is not None and commit.mode == "create":
                raise AlreadyExists("file exists", clean)
            if old is not None and old.kind == "directory":
                raise IsADirectory("a directory has this name", clean)
            if old is None:
                touched[name[0]] = now  # its times move once, at the end (see ``_touch``)
            else:
                tx.tree.unlink(*name)
            made.append((*name, NewFile(self._attributes(commit, old, size, now), commit.extents)))
        nodes = tx.files.create_files(made)
        _spare_collected(tx, [s for c in commits for s in c.stored])
        self._quotas.charge(
            tx,
            [
                self._quotas.replaced(clean, node, olds.get(name))
                for (_, clean, _), node, name in zip(checked, nodes, names, strict=True)
            ],
        )
        for name, node in zip(names, nodes, strict=True):
            old = olds.get(name)
            if old is not None:  # after the new one is numbered: SQLite would reuse its number
                if old.nlink > 1:
                    tx.tree.relink(old.id, node.id)  # its other names see the new version too
                tx.files.delete(old.id)
        changed_rows(
            tx, [(c, n.id, n.ctime_ns) for (_, c, _), n in zip(checked, nodes, strict=True)]
        )
        return [info(clean, node) for (_, clean, _), node in zip(checked, nodes, strict=True)]

    def _checked(self, commit: FileCommit) -> tuple[tuple[str, ...], str, int]:
        """A commit's path (parts, normalised) and size, once it is shown well formed."""
        parts = _paths.split(commit.path)
        clean = _paths.join_parts(parts)
        if not parts:
            raise IsADirectory("cannot write to the root", clean)
        size = _check_extents(commit.extents, clean)
        _check_commit(commit, size, clean)
        for stored in commit.stored:
            if stored.data is not None:
                _check_inline(stored, self._policy.inline_max, clean)
        return parts, clean, size

    def _attributes(self, commit: FileCommit, old: Inode | None, size: int, now: int) -> Inode:
        """The new version's row: what the commit sets, else what ``old`` had."""
        c = commit
        mode = c.permissions
        if mode is None:
            mode = FILE_MODE if old is None else old.mode & PERMISSION_BITS
        mtime = now if c.mtime_ns is None else c.mtime_ns
        uid = c.uid if c.uid is not None else -1 if old is None else old.uid
        gid = c.gid if c.gid is not None else -1 if old is None else old.gid
        generation = 1 if old is None else old.generation + 1
        links = 1 if old is None else old.nlink
        copies = self._replication(c.replication)
        return Inode(
            0, "file", size, mode, mtime, generation, copies, uid, gid, now, mtime, links, c.rdev
        )


def _touch(tx: Tx, touched: Touched) -> None:
    """Move the times of the directories new files went into: once each, in inode order,
    last in the transaction. A group of 64 files into one directory changes its row once,
    not 64 times, and holds that row's lock only from here to the commit, so writers of
    other services wait for it a moment, not a whole transaction."""
    for directory in sorted(touched):
        tx.tree.touch(directory, touched[directory])


def _check_held(
    tx: Tx, commits: Sequence[FileCommit], checked: Sequence[tuple[tuple[str, ...], str, int]]
) -> None:
    """Every chunk the commits name is in the store: what they store is known now; only
    the chunks they reuse are asked for."""
    stored = {s.chunk.id for c in commits for s in c.stored}
    missing = {x.chunk.id for c in commits for x in c.extents} - stored
    if missing:
        missing -= tx.chunks.known(missing)
    if not missing:
        return
    gone = min(missing)
    clean = next(
        clean
        for c, (_, clean, _) in zip(commits, checked, strict=True)
        if any(x.chunk.id == gone for x in c.extents)
    )
    raise IntegrityError(
        f"commit names {len(missing)} chunk(s) the store does not hold "
        f"(collected while the writer was open?): {gone}",
        clean,
    )


def _spare_collected(tx: Tx, stored: Sequence[StoredChunk]) -> None:
    """Forget the copies a commit names that collection may have deleted: of a chunk it
    forgot while the writer was open, those not shown written (a node's receipt) after
    the cutoff its copies went under. The chunk must still be held some other way (the
    rest of its copies, another writer's), or the commit fails rather than name bytes
    that are gone. After the references are taken: a collection that forgets a chunk
    from now on waits for this transaction, and one before it is seen here. (A copy
    another writer stored again on the same node and committed is forgotten with it:
    its file stays, an orphan, and repair makes the copy again elsewhere.)"""
    cut = tx.chunks.collected({s.chunk.id for s in stored if s.nodes})
    doubtful: dict[str, list[str]] = {}
    for s in stored:
        if s.chunk.id in cut:
            written = {r.node: r.expires - auth.RECEIPT_TTL_S for r in s.receipts}
            after = cut[s.chunk.id] / 1e9
            doubtful[s.chunk.id] = [n for n in s.nodes if written.get(n, -math.inf) < after]
    for chunk, nodes in doubtful.items():
        for node in nodes:
            tx.chunks.drop_replica(chunk, node)
    lost = sorted(c for c, nodes in doubtful.items() if nodes)
    if lost and (gone := set(lost) - set(tx.chunks.referenced(lost))):
        raise IntegrityError(
            f"chunk {min(gone)} was collected while this file was being written (its "
            "copies may be gone): write the file again"
        )


class _BatchFailed(Exception):
    """A batch of a group committed together failed: the group goes again, apart."""


def check_time(ns: int | None, path: str) -> None:
    """A time must fit the engines' 64-bit nanoseconds (years 1677 to 2262)."""
    if ns is not None and ns not in TIME_RANGE:
        raise InvalidArgument(f"time {ns} ns is out of range (years 1677 to 2262)", path)


def check_owner(uid: int | None, gid: int | None, path: str) -> None:
    """User and group ids are 0 to 2**32 - 2, or -1 for "none recorded"."""
    for what, value in (("user", uid), ("group", gid)):
        if value is not None and not -1 <= value <= MAX_ID:
            raise InvalidArgument(f"{what} id {value} is out of range", path)


def _check_commit(commit: FileCommit, size: int, path: str) -> None:
    mode = commit.permissions
    if mode is not None:
        if mode < 0 or mode & ~(PERMISSION_BITS | 0o170000) or stat.S_IFMT(mode) not in TYPES:
            raise InvalidArgument(f"mode {mode:#o} is not a file's", path)
        if stat.S_IFMT(mode) in CONTENTLESS and size:
            raise InvalidArgument("a fifo, socket or device node holds no bytes", path)
    check_time(commit.mtime_ns, path)
    check_owner(commit.uid, commit.gid, path)


def _check_inline(stored: StoredChunk, limit: int, path: str) -> None:
    """Bytes the engine is to keep must be small and be the chunk they say they are: a
    forged id would serve them to every file that names that chunk."""
    chunk, data = stored.chunk, stored.data
    assert data is not None
    if len(data) > limit:
        raise InvalidArgument(
            f"{len(data)} bytes are over this service's inline limit of {limit}", path
        )
    if stored.nodes:
        raise InvalidArgument(f"chunk {chunk.id} is kept inline and on nodes at once", path)
    if len(data) != chunk.length or crc32c(data) != chunk.crc32c:
        raise IntegrityError(f"the bytes sent for chunk {chunk.id} do not match it", path)
    if content_id(memoryview(data)) != chunk.id:
        raise IntegrityError(f"the bytes sent for chunk {chunk.id} do not hash to its id", path)


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
