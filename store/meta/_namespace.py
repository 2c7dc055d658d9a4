"""The namespace: names, directories and files' attributes over a repository.

``Namespace`` resolves paths (``_walk``), lists, makes, links, renames and
removes names, and changes attributes; each mutation is one function run in a
``repo.transact`` transaction (which the engine may run again when a
concurrent writer conflicts), applied once per idempotency key
(``_idempotency``). What a removal frees goes back to the quotas
(``Quotas``); a rename may commit files first (``Commits``). ``Metadata``
(``_metadata.py``) makes it with the other components.
"""

from __future__ import annotations

import dataclasses
import time

from .. import _paths
from .._config import page_entries
from .._errors import (
    AlreadyExists,
    DirectoryNotEmpty,
    InvalidArgument,
    InvalidPath,
    IsADirectory,
    NotADirectory,
    NotFound,
)
from .._types import Change, ChangeFeed, FileCommit, FileInfo, FileLayout
from ..transport import (
    LAYOUT_PAGE,
    LIST_PAGE,
    MAX_PAGE,
    Changed,
    Changes,
    GetLayout,
    Link,
    ListDir,
    Listing,
    MakeDir,
    Remove,
    Removed,
    RemoveEach,
    Rename,
    SetAttributes,
    SetAttributesEach,
    Stat,
)
from ..wire import to_wire
from ._changes import changed, feed
from ._commits import (
    PERMISSION_BITS,
    Commits,
    check_owner,
    check_time,
)
from ._idempotency import write_once
from ._operations import handles
from ._quotas import Quotas
from ._repo import Inode, Repository, Tx
from ._walk import (
    DIR_MODE,
    ensure_dirs,
    info,
    lock,
    new_directory,
    resolve,
    resolve_dir,
)


class Namespace:
    """Namespace operations over a repository."""

    def __init__(self, repo: Repository, quotas: Quotas, commits: Commits) -> None:
        self.repo = repo
        self._quotas = quotas
        self._commits = commits

    # -- reads ----------------------------------------------------------------

    @handles(Stat)
    def stat(self, path: str) -> FileInfo:
        """Attributes of one path."""
        parts = _paths.split(path)
        with self.repo.read() as tx:
            return info(_paths.join_parts(parts), resolve(tx, parts, path))

    @handles(ListDir)
    def listdir(self, path: str, after: str = "", limit: int = 0, directory: int = 0) -> Listing:
        """A page of a directory's entries sorted by name; a file lists as itself.

        ``directory`` (an inode from an earlier page) lists that directory
        whatever its path is now; ``NotFound`` if it is gone.
        """
        parts = _paths.split(path)
        base = _paths.join_parts(parts)
        limit = _page(limit, LIST_PAGE)
        with self.repo.read() as tx:
            node = tx.tree.get(directory) if directory else resolve(tx, parts, path)
            if node is None or (directory and node.kind != "directory"):
                raise NotFound("the directory was removed while being listed", base)
            if node.kind == "file":
                return Listing([info(base, node)])
            page = tx.tree.children_page(node.id, after, limit + 1)
        prefix = base.rstrip("/")
        entries = [info(f"{prefix}/{name}", child) for name, child in page[:limit]]
        return Listing(entries, node.id, len(page) > limit)

    @handles(Changes)
    def changes(self, after: int = -1, missing: tuple[int, ...] = (), limit: int = 0) -> ChangeFeed:
        """The change feed after ``after`` (``_changes.feed``)."""
        return feed(self.repo, after, missing, limit)

    @handles(GetLayout)
    def layout(self, path: str, start: int = 0, limit: int = 0, inode: int = 0) -> FileLayout:
        """A page of a file's extents from offset ``start``, with attributes and replicas.

        ``inode`` (from an earlier page) pins the version: ``NotFound`` if it
        was replaced meanwhile.
        """
        parts = _paths.split(path)
        clean = _paths.join_parts(parts)
        limit = _page(limit, LAYOUT_PAGE)
        with self.repo.read() as tx:
            node = tx.tree.get(inode) if inode else resolve(tx, parts, path)
            if node is None:
                raise NotFound("the file was replaced while being opened", clean)
            if node.kind == "directory":
                raise IsADirectory("is a directory", clean)
            extents = tx.files.extents_page(node.id, start, limit + 1)
            ids = {x.chunk.id for x in extents[:limit]}
            replicas = tx.chunks.replicas(ids)
            inline = tx.chunks.inline(ids - replicas.keys())  # only a chunk no node holds
            rest = ids - replicas.keys() - inline.keys()
            stripes = tx.stripes.stripes(rest) if rest else {}
        more = len(extents) > limit
        return FileLayout(
            info(clean, node),
            tuple(extents[:limit]),
            replicas,
            more=more,
            inline=inline,
            stripes=stripes,
        )

    # -- namespace mutations -----------------------------------------------------

    @handles(MakeDir)
    def mkdir(
        self,
        path: str,
        parents: bool = False,
        exist_ok: bool = False,
        *,
        mode: int | None = None,
        uid: int = -1,
        gid: int = -1,
        key: str = "",
    ) -> FileInfo:
        """Create a directory (and its parents with ``parents``), owned by ``uid``/``gid``
        (-1: none recorded), with ``mode`` (else 0o755)."""
        parts = _paths.split(path)
        clean = _paths.join_parts(parts)
        if not parts:
            if exist_ok:
                return self.stat(clean)
            raise AlreadyExists("the root always exists", clean)
        bits = DIR_MODE if mode is None else _permission_bits(mode, clean)
        check_owner(uid, gid, clean)

        def make(tx: Tx) -> FileInfo:
            find = ensure_dirs if parents else resolve_dir
            parent = find(tx, parts[:-1], path)
            found = tx.tree.lookup(parent.id, parts[-1])
            if found is not None:
                if exist_ok and found.kind == "directory":
                    return info(clean, found)
                raise AlreadyExists("already exists", clean)
            made = new_directory(tx, parent.id, parts[-1], bits, uid, gid)
            changed(tx, (clean, made))
            return info(clean, made)

        return write_once(self.repo, key, FileInfo, make)

    @handles(Remove)
    def remove(self, path: str, recursive: bool = False, *, key: str = "") -> int:
        """Remove a file, or a directory (its contents too with ``recursive``)."""
        parts = _paths.split(path)
        if not parts:
            raise InvalidPath("refusing to remove the root", _paths.join_parts(parts))
        return write_once(self.repo, key, int, lambda tx: self._remove(tx, parts, path, recursive))

    @handles(RemoveEach)
    def remove_each(
        self, paths: tuple[str, ...], directories: tuple[bool, ...] = (), *, key: str = ""
    ) -> list[Removed]:
        """Remove each path in turn, in one transaction (one fsync for all); a path that
        cannot go gets its error and leaves the others alone."""

        if directories and len(directories) != len(paths):
            raise InvalidArgument(f"{len(paths)} paths, {len(directories)} directory flags")
        may_be_dirs = directories or (True,) * len(paths)

        def each(tx: Tx) -> list[Removed]:
            done = []
            for path, directory in zip(paths, may_be_dirs, strict=True):
                try:
                    parts = _paths.split(path)
                    if not parts:
                        raise InvalidPath("refusing to remove the root", "/")
                    count = self._remove(tx, parts, path, False, directories=directory)
                except (NotFound, NotADirectory, IsADirectory, DirectoryNotEmpty, InvalidPath) as e:
                    done.append(Removed(error=to_wire(e)))  # raised before anything changed
                else:
                    done.append(Removed(count))
            return done

        return write_once(self.repo, key, list[Removed], each)

    def _remove(
        self,
        tx: Tx,
        parts: tuple[str, ...],
        path: str,
        recursive: bool,
        *,
        directories: bool = True,
    ) -> int:
        clean = _paths.join_parts(parts)
        parent = resolve_dir(tx, parts[:-1], path)
        node = tx.tree.locked_entry(parent.id, parts[-1])  # a directory: no entry added meanwhile
        if node is None:
            raise NotFound("no such file or directory", clean)
        if node.kind == "directory" and not directories:
            raise IsADirectory("is a directory", clean)
        if node.kind == "directory" and not recursive and tx.tree.has_children(node.id):
            raise DirectoryNotEmpty("directory not empty (use recursive)", clean)
        self._unname(tx, parent.id, parts[-1], node)
        changed(tx, (clean, None))
        return self._drop(tx, node, clean)

    @staticmethod
    def _unname(tx: Tx, parent: int, name: str, node: Inode) -> None:
        """Drop the entry ``name`` (naming ``node``) from ``parent``, which changes."""
        tx.tree.unlink(parent, name)
        tx.tree.touch(parent, time.time_ns(), links=-1 if node.kind == "directory" else 0)

    def _drop(self, tx: Tx, node: Inode, path: str) -> int:
        """``node`` lost its name ``path``: a file with none left goes, a directory goes
        with all below it (and its quotas get back what went); how many names went."""
        count, pending, now, freed = 0, [node], time.time_ns(), [0, 0, 0]
        while pending:
            current = pending.pop()
            count += 1
            if current.kind == "directory":
                lock(tx, current)  # no entry is added to it while it goes
                for name, child in tx.tree.children(current.id):
                    tx.tree.unlink(current.id, name)
                    pending.append(child)
            elif tx.tree.touch(current.id, now, links=-1, modified=False) > 0:
                continue  # another name still leads to it
            else:
                freed = [a + b for a, b in zip(freed, self._quotas.held(current), strict=True)]
            tx.files.delete(current.id)
        self._quotas.release(tx, path, (freed[0], freed[1], freed[2]), node.kind == "directory")
        return count

    @handles(Link)
    def link(self, src: str, dst: str, *, key: str = "") -> FileInfo:
        """Give the file at ``src`` another name, ``dst`` (a hard link: one file, two
        names; a new version written at either is what both show). ``dst``'s directory
        must exist and ``dst`` must not."""
        sparts, dparts = _paths.split(src), _paths.split(dst)
        clean_src, clean_dst = _paths.join_parts(sparts), _paths.join_parts(dparts)
        if not dparts:
            raise AlreadyExists("the root always exists", clean_dst)

        def add(tx: Tx) -> FileInfo:
            node = lock(tx, resolve(tx, sparts, src))
            if node.kind == "directory":
                raise IsADirectory("a directory cannot have another name", clean_src)
            parent = resolve_dir(tx, dparts[:-1], dst)
            if tx.tree.lookup(parent.id, dparts[-1]) is not None:
                raise AlreadyExists("file exists", clean_dst)
            self._quotas.check_move(tx, clean_src, clean_dst, node)
            now = time.time_ns()
            tx.tree.link(parent.id, dparts[-1], node.id)
            tx.tree.touch(parent.id, now)
            links = tx.tree.touch(node.id, now, links=1, modified=False)
            linked = dataclasses.replace(node, nlink=links, ctime_ns=max(now, node.ctime_ns))
            changed(tx, (clean_src, linked), (clean_dst, linked))
            return info(clean_dst, linked)

        return write_once(self.repo, key, FileInfo, add)

    @handles(Rename)
    def rename(
        self,
        src: str,
        dst: str,
        replace: bool = True,
        replace_tree: bool = False,
        *,
        key: str = "",
        files: tuple[FileCommit, ...] = (),
    ) -> FileInfo:
        """Move ``src`` to ``dst`` in one transaction (``os.replace`` semantics).

        With ``replace_tree`` a non-empty destination directory is replaced too:
        readers see the old tree or the new one, never neither. ``files`` are
        committed first in the same transaction (all of it or none).
        """
        sparts, dparts = _paths.split(src), _paths.split(dst)
        if not sparts or not dparts:
            clean_src, clean_dst = _paths.join_parts(sparts), _paths.join_parts(dparts)
            raise InvalidPath("cannot rename the root", clean_src if not sparts else clean_dst)

        def move(tx: Tx) -> FileInfo:
            if files:
                self._commits.commit_in(tx, files)
            how = ((sparts, src), (dparts, dst), replace, replace_tree)
            try:
                return self._move(tx, *how, locked=False)
            except _MovesDirectory:
                # Directories move one at a time; the paths are resolved again under the lock.
                tx.tree.lock_tree()
                return self._move(tx, *how, locked=True)

        return write_once(self.repo, key, FileInfo, move)

    def _move(
        self,
        tx: Tx,
        source: tuple[tuple[str, ...], str],
        destination: tuple[tuple[str, ...], str],
        replace: bool,
        replace_tree: bool,
        *,
        locked: bool,
    ) -> FileInfo:
        (sparts, src), (dparts, dst) = source, destination
        clean_src, clean_dst = _paths.join_parts(sparts), _paths.join_parts(dparts)
        sparent = resolve_dir(tx, sparts[:-1], src)
        node = tx.tree.lookup(sparent.id, sparts[-1])
        if node is None:
            raise NotFound("no such file or directory", clean_src)
        if clean_src == clean_dst:
            return info(clean_dst, node)
        if node.kind == "directory" and not locked:
            raise _MovesDirectory
        node = tx.tree.locked_entry(sparent.id, sparts[-1])
        if node is None:
            raise NotFound("no such file or directory", clean_src)
        if _paths.is_within(clean_dst, clean_src):
            raise InvalidPath(f"cannot move {clean_src} into itself", clean_dst)
        dparent = ensure_dirs(tx, dparts[:-1], dst)
        target = tx.tree.locked_entry(dparent.id, dparts[-1])  # a directory: no entry added
        if target is not None and target.id == node.id:
            return info(clean_dst, node)  # two names of one file: nothing to do (POSIX)
        if target is not None:
            self._check_replace(tx, node, target, replace, replace_tree, clean_dst)
            self._unname(tx, dparent.id, dparts[-1], target)
            self._drop(tx, target, clean_dst)
        self._quotas.check_move(tx, clean_src, clean_dst, node)
        self._unname(tx, sparent.id, sparts[-1], node)
        now = time.time_ns()
        tx.tree.link(dparent.id, dparts[-1], node.id)
        tx.tree.touch(dparent.id, now, links=1 if node.kind == "directory" else 0)
        tx.tree.touch(node.id, now, modified=False)
        moved = dataclasses.replace(node, ctime_ns=max(now, node.ctime_ns))
        changed(tx, (clean_src, None), (clean_dst, moved))
        return info(clean_dst, moved)

    def _check_replace(
        self, tx: Tx, node: Inode, target: Inode, replace: bool, replace_tree: bool, dst: str
    ) -> None:
        if not (replace or replace_tree):
            raise AlreadyExists("destination exists", dst)
        if node.kind == "file" and target.kind == "directory":
            raise IsADirectory("cannot replace a directory with a file", dst)
        if node.kind == "directory" and target.kind == "file":
            raise NotADirectory("cannot replace a file with a directory", dst)
        if target.kind == "directory" and not replace_tree and tx.tree.has_children(target.id):
            raise DirectoryNotEmpty("destination directory is not empty", dst)

    # -- the write path -------------------------------------------------------

    @handles(SetAttributes)
    def set_attributes(self, path: str, change: Change, *, key: str = "") -> FileInfo:
        """Change mode bits, times or owner in place; the ctime moves to now."""
        parts = _paths.split(path)
        clean = _paths.join_parts(parts)
        _check_change(change, clean)

        def apply(tx: Tx) -> FileInfo:
            node = lock(tx, resolve(tx, parts, clean))
            after = changed_inode(node, change, time.time_ns())
            tx.tree.update(after)
            changed(tx, (clean, after))
            return info(clean, after)

        return write_once(self.repo, key, FileInfo, apply)

    @handles(SetAttributesEach)
    def set_attributes_each(
        self, paths: tuple[str, ...], changes: tuple[Change, ...], *, key: str = ""
    ) -> list[Changed]:
        """``set_attributes`` for each path in turn, in one transaction (one fsync for
        all); a path that is gone gets its error and leaves the others alone."""
        if len(paths) != len(changes):
            raise InvalidArgument(f"{len(paths)} paths, {len(changes)} changes")
        for path, change in zip(paths, changes, strict=True):
            _check_change(change, _paths.normalize(path))  # all refused, or none

        def each(tx: Tx) -> list[Changed]:
            done, now = [], time.time_ns()
            for path, change in zip(paths, changes, strict=True):
                parts = _paths.split(path)
                clean = _paths.join_parts(parts)
                try:
                    node = lock(tx, resolve(tx, parts, clean))
                except (NotFound, NotADirectory) as exc:  # raised before anything changed
                    done.append(Changed(error=to_wire(exc)))
                    continue
                after = changed_inode(node, change, now)
                tx.tree.update(after)
                changed(tx, (clean, after))
                done.append(Changed(info(clean, after)))
            return done

        return write_once(self.repo, key, list[Changed], each)


class _MovesDirectory(Exception):
    """A rename found it moves a directory: it must hold the directory-move lock first."""


def changed_inode(node: Inode, change: Change, now_ns: int) -> Inode:
    """``node`` with ``change`` applied at ``now_ns`` (``Change.applied``)."""
    return dataclasses.replace(node, **change.applied(node, now_ns))


def _check_change(change: Change, path: str) -> None:
    if change.mode is not None:
        _permission_bits(change.mode, path)
    check_time(change.mtime_ns, path)
    check_time(change.atime_ns, path)
    check_owner(change.uid, change.gid, path)


def _permission_bits(mode: int, path: str) -> int:
    if not 0 <= mode <= PERMISSION_BITS:
        raise InvalidArgument(f"mode {mode:#o} is not permission bits (0 to 0o7777)", path)
    return mode


def _page(asked: int, default: int) -> int:
    """Entries in one page: what was asked, within reason."""
    if asked < 0:
        raise InvalidArgument(f"a page size must not be negative, not {asked}")
    return min(page_entries(asked, default), MAX_PAGE)
