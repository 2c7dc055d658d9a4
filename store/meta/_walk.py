"""Names to inodes inside one transaction: resolving a path, making missing directories.

Pure functions of a ``Tx`` (no state of their own), shared by the namespace's
reads and mutations (``_namespace``) and its write path (``_commits``).
"""

from __future__ import annotations

import time

from .. import _paths
from .._errors import NotADirectory, NotFound
from .._types import FileInfo
from ._repo import ROOT_INODE, Conflict, Inode, Tx

ROOT = Inode(ROOT_INODE, "directory", 0, 0o755, 0, 1, 1, nlink=2)
Directories = dict[tuple[str, ...], Inode]
"""Directories one write transaction resolved, by their path's parts."""
DIR_MODE = 0o755


def info(path: str, inode: Inode) -> FileInfo:
    """The ``FileInfo`` of ``inode`` at ``path``."""
    n = inode
    return FileInfo(
        path,
        *(n.kind, n.size, n.mtime_ns, n.id, n.generation, n.replication, n.mode),
        *(n.uid, n.gid, n.ctime_ns, n.atime_ns, n.nlink, n.rdev),
    )


def resolve(tx: Tx, parts: tuple[str, ...], path: str) -> Inode:
    """The inode ``parts`` names (``NotFound``, ``NotADirectory`` on the way)."""
    if not parts:
        return tx.tree.get(ROOT_INODE) or ROOT
    found = tx.tree.walk(parts)  # one query where the engine is across a network
    for depth, node in enumerate(found, start=1):
        if depth < len(parts) and node.kind != "directory":
            where = _paths.join_parts(parts[:depth])
            raise NotADirectory(f"{where} is a file, not a directory", path)
    if len(found) < len(parts):
        raise NotFound("no such file or directory", path)
    return found[-1]


def resolve_dir(tx: Tx, parts: tuple[str, ...], path: str) -> Inode:
    """The directory ``parts`` names (``NotADirectory`` if it is a file)."""
    node = resolve(tx, parts, path)
    if node.kind != "directory":
        raise NotADirectory("not a directory", _paths.join_parts(parts))
    return node


def ensure_dirs(
    tx: Tx, parts: tuple[str, ...], path: str, known: Directories | None = None
) -> Inode:
    """Resolve a directory, creating the missing ones on the way.

    ``known`` holds directories this write transaction resolved or made
    already (a commit group's files mostly share a few): no lookup for
    them again. Another writer may move or remove one meanwhile: a name
    added to a removed directory meets ``Conflict`` (its ``touch``) and the
    transaction runs again; one added to a moved directory is where a
    serial order would have put it.
    """
    if known is not None and parts in known:
        return known[parts]
    node = ROOT
    for depth, name in enumerate(parts):
        if known is not None and parts[: depth + 1] in known:
            node = known[parts[: depth + 1]]
            continue
        found = tx.tree.lookup(node.id, name)
        if found is None:
            found = new_directory(tx, node.id, name)
        elif found.kind != "directory":
            where = _paths.join_parts(parts[: depth + 1])
            raise NotADirectory(f"{where} is a file, not a directory", path)
        node = found
        if known is not None:
            known[parts[: depth + 1]] = node
    return node


def lock(tx: Tx, node: Inode) -> Inode:
    """``node`` as it is now, locked until the transaction ends (``Conflict`` if gone):
    before a change computed from it, or before its entries are counted to remove it."""
    found = tx.tree.locked(node.id)
    if found is None:
        raise Conflict(f"inode {node.id} went before it could be locked")
    return found


def new_directory(
    tx: Tx, parent: int, name: str, mode: int = DIR_MODE, uid: int = -1, gid: int = -1
) -> Inode:
    """Make a directory named ``name`` in ``parent`` (the name must be free)."""
    now = time.time_ns()
    node = tx.tree.create(Inode(0, "directory", 0, mode, now, 1, 1, uid, gid, now, now, nlink=2))
    tx.tree.link(parent, name, node.id)
    tx.tree.touch(parent, now, links=1)
    return node
