"""Whole store trees: the walk ``get -r``, ``cp -r`` and ``du --physical`` share; ``cp``.

A walk lists a tree once, before anything is written, so a command can
refuse (``get -r -x``, ``cp -r`` into itself) before it starts, and show
one progress bar for the whole tree.
"""

from __future__ import annotations

import argparse
import posixpath
import stat
import sys
from dataclasses import dataclass

from .._errors import InvalidArgument, InvalidPath, IsADirectory, NotFound
from .._paths import is_within, normalize
from .._types import FileInfo
from ..client import Client
from ._render import shown
from ._stores import locate, open_client, remote_dest


@dataclass(frozen=True, slots=True)
class Entry:
    """One file or directory of a walked tree."""

    parts: tuple[str, ...]
    """Its names below the walk's root (``()`` for the root itself)."""
    info: FileInfo
    """Its attributes, as listed."""


def walk(client: Client, root: str, *, live: bool = False) -> list[Entry]:
    """``root`` and everything below it, each directory before its entries, by name.

    Every name is checked to be one plain name, so that a damaged or hostile
    listing cannot lead a caller writing ``parts`` out of its own directory.
    With ``live``, a directory below ``root`` removed while it is walked is left out
    (a count over a store in use), rather than fail the walk.
    """
    found: list[Entry] = []
    pending = [Entry((), client.stat(root))]
    while pending:
        entry = pending.pop()
        found.append(entry)
        if entry.info.is_dir:
            try:
                listing = client.ls(entry.info.path)
            except NotFound:
                if not live or not entry.parts:
                    raise
                continue
            pending += reversed([Entry((*entry.parts, _plain(i.name)), i) for i in listing])
    return found


def _plain(name: str) -> str:
    if name in ("", ".", "..") or "/" in name or "\x00" in name:
        raise InvalidPath("the store listed a name that is not one plain name", repr(name))
    return name


def without_links(entries: list[Entry], command: str) -> list[Entry]:
    """``entries`` less the symbolic links (made through a mount), each named on stderr:
    neither followed nor made again here, so that no link can lead a copy out of its
    destination. A link named itself is refused."""
    if entries and stat.S_ISLNK(entries[0].info.mode):
        why = f"is a symbolic link ({command} copies files and directories)"
        raise InvalidArgument(why, entries[0].info.path)
    kept = []
    for entry in entries:
        if stat.S_ISLNK(entry.info.mode):
            print(f"graben: skipped the symbolic link {shown(entry.info.path)}", file=sys.stderr)
        else:
            kept.append(entry)
    return kept


def physical(client: Client, root: str) -> tuple[int, int]:
    """``(bytes, chunks)`` the store holds for the files at or below ``root``: each
    distinct chunk once, times the copies the metadata knows of (shared with files
    elsewhere or not); an erasure-coded chunk, the pieces its nodes hold."""
    held: dict[str, int] = {}
    for entry in walk(client, root, live=True):
        if entry.info.is_dir:
            continue
        try:
            layout = client.layout(entry.info.path)
        except NotFound:  # removed since it was listed: no longer held for it
            continue
        for extent in layout.extents:
            stripe = layout.stripes.get(extent.chunk.id)
            if stripe is not None:
                pieces = zip(stripe.pieces, stripe.nodes, strict=True)
                held[extent.chunk.id] = sum(p.length for p, node in pieces if node)
                continue
            copies = len(layout.replicas.get(extent.chunk.id, ())) or 1
            held[extent.chunk.id] = extent.chunk.length * copies
    return sum(held.values()), len(held)


def cp(args: argparse.Namespace) -> int:
    store, (src, dst) = locate(args.store, args.src, args.dst)
    with open_client(store, args) as client:
        [entry] = without_links([Entry((), client.stat(src))], "cp")
        info = entry.info
        dest = remote_dest(client, dst, posixpath.basename(normalize(src)))
        if not info.is_dir:
            client.copy(src, dest, exclusive=args.no_clobber)
        elif not args.recursive:
            raise IsADirectory("is a directory (use cp -r to copy a tree)", src)
        else:
            _copy_tree(client, src, dest, exclusive=args.no_clobber)
    return 0


def _copy_tree(client: Client, src: str, dest: str, *, exclusive: bool) -> None:
    """Copy a tree file by file, each a metadata commit sharing the source's chunks."""
    if is_within(normalize(dest), normalize(src)):
        raise InvalidArgument(f"cannot copy {src} into itself", dest)
    for entry in without_links(walk(client, src), "cp"):
        target = posixpath.join(dest, *entry.parts)
        if entry.info.is_dir:
            client.mkdir(target, parents=True, exist_ok=True)
        else:
            client.copy(entry.info.path, target, exclusive=exclusive)
