"""The repository's tree: names, inodes, their files' extents, chunks and stripes.

Four of the narrow protocols a transaction (``Tx`` in ``_repo.py``) holds, one per
concern, with the values they speak in. The three layers (names ``(parent, name) ->
inode``, files ``inode -> attributes, extents``, chunks ``id -> length, crc32c, refs,
replicas``) are ``Tree`` (names and the inodes they name), ``Files`` (a file's extents
and the chunk references they hold) and ``Chunks`` (the chunk rows and who holds each);
``Stripes`` keeps storage classes and the pieces of erasure-coded chunks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import msgspec

from .._types import ChunkRef, Collection, Extent, Kind, StoredChunk, Stripe

ROOT_INODE = 1
IN_TIER = "@s3"
"""The node a chunk in the S3 tier is recorded on: a stripe of one piece, the chunk itself
(``Stripe(1, 0, (chunk,), (IN_TIER,))``); no data node holds it for good."""
ChunkRecord = tuple[ChunkRef, tuple[str, ...]]
"""A chunk and the nodes holding it."""
Forgotten = tuple[ChunkRef, tuple[str, ...], int]
"""A chunk collection forgot, the nodes that held it, and the cutoff (ns) its copies go
under: a copy (re)written since then stays (a new upload of the same bytes)."""


@dataclass(frozen=True, slots=True)
class Inode:
    """A row of the file layer."""

    id: int
    """Inode number, unique for the life of the store."""
    kind: Kind
    """``"file"`` or ``"directory"``."""
    size: int
    """Bytes in the file."""
    mode: int
    """Permission bits (with the type bits of a symbolic link, fifo, socket or device)."""
    mtime_ns: int
    """Modification time, ns since the epoch."""
    generation: int
    """Version count of the path it was committed to."""
    replication: int
    """Copies kept of each chunk."""
    uid: int = -1
    """Owner's user id; -1 for none recorded (whoever mounts the store)."""
    gid: int = -1
    """Owner's group id; -1 for none recorded."""
    ctime_ns: int = 0
    """When its attributes or names last changed, ns since the epoch; never goes back."""
    atime_ns: int = 0
    """Access time, ns since the epoch (set by ``touch -a`` and copies; reads leave it)."""
    nlink: int = 1
    """Names a file has (hard links); a directory's is 2 plus its subdirectories."""
    rdev: int = 0
    """The device number of a device node."""


INODE_COLUMNS = (
    "id, kind, size, mode, mtime_ns, generation, replication, "
    "uid, gid, ctime_ns, atime_ns, nlink, rdev"
)
"""An inode row's columns, in ``Inode``'s field order."""
NEW_INODE_COLUMNS = INODE_COLUMNS.removeprefix("id, ")
"""The columns a new inode's row is given (its number is the engine's)."""


def new_values(node: Inode) -> tuple[object, ...]:
    """A new inode's values for ``NEW_INODE_COLUMNS``."""
    n = node
    return (
        *(n.kind, n.size, n.mode, n.mtime_ns, n.generation, n.replication),
        *(n.uid, n.gid, n.ctime_ns, n.atime_ns, n.nlink, n.rdev),
    )


@dataclass(frozen=True, slots=True)
class NewFile:
    """What ``Files.create_file`` makes: a file inode's attributes and content."""

    attributes: Inode
    """Its row (its ``id`` is ignored: the engine numbers it)."""
    extents: tuple[Extent, ...]
    """Its content, tiling it from offset 0."""

    def inode(self, number: int) -> Inode:
        """The inode it is, once numbered."""
        return replace(self.attributes, id=number)


class Degraded(msgspec.Struct, frozen=True):
    """A chunk with fewer live copies than its files ask for."""

    chunk: ChunkRef
    """The chunk."""
    live: tuple[str, ...]
    """Alive nodes holding a copy."""
    want: int
    """Copies its most demanding file asks for."""
    draining: tuple[str, ...] = ()
    """Live draining nodes holding a copy: read from, never counted (``meta/_drain.py``)."""


class Tree(Protocol):
    """Names and the inodes they name: lookups, attributes, links and the locks a writer
    takes before it changes them (see docs/architecture.md, "Writes side by side")."""

    def lookup(self, parent: int, name: str) -> Inode | None:
        """The inode named ``name`` in directory ``parent``."""

    def walk(self, parts: Sequence[str]) -> list[Inode]:
        """The inodes ``parts`` names from the root down, one per part, as far as they
        exist: ``parts[0]`` in the root, ``parts[1]`` in that, and so on (ends at the
        first name missing, or past a file)."""

    def get(self, inode: int) -> Inode | None:
        """The inode with this number."""

    def locked(self, inode: int) -> Inode | None:
        """The inode with this number as it is now, no other writer changing or deleting
        it until this transaction ends (read it so before a change computed from it)."""

    def locked_entry(self, parent: int, name: str) -> Inode | None:
        """The inode ``name`` names in ``parent``, locked as ``locked`` and still named so:
        a writer that replaced, moved or removed it meanwhile is waited for and what it left
        read again, so writers of one name take turns instead of all running again. Lock an
        inode so before changing its names: one order for every writer, so none deadlock."""

    def locked_entries(self, names: Sequence[tuple[int, str]]) -> dict[tuple[int, str], Inode]:
        """``locked_entry`` for many ``(parent, name)`` at once: those that name an inode,
        each locked and still so named (one round trip or two where the engine is across
        a network, not two per name)."""

    def lock_tree(self) -> None:
        """Hold the store's one directory-move lock until this transaction ends: directories
        move one at a time, so no two moves together make a cycle (Linux's rename lock)."""

    def children(self, parent: int) -> list[tuple[str, Inode]]:
        """Entries of a directory, sorted by name."""

    def children_page(self, parent: int, after: str, limit: int) -> list[tuple[str, Inode]]:
        """At most ``limit`` entries of a directory named after ``after``, sorted by name."""

    def has_children(self, parent: int) -> bool:
        """Whether a directory has any entry."""

    def create(self, node: Inode) -> Inode:
        """A new inode with ``node``'s attributes (its ``id`` ignored), not yet linked anywhere."""

    def update(self, node: Inode) -> None:
        """Set an inode's mode, times and owner to ``node``'s (``Conflict`` if it is gone)."""

    def touch(self, inode: int, now_ns: int, *, links: int = 0, modified: bool = True) -> int:
        """An inode's names or entries changed: its ctime moves to ``now_ns`` (never back),
        its link count by ``links``, and with ``modified`` (a directory's entries) its mtime
        to ``now_ns``; the link count it has now (``Conflict`` if the inode is gone)."""

    def relink(self, old: int, new: int) -> None:
        """Every entry naming inode ``old`` names ``new`` instead (a new version of a file
        with several names)."""

    def link(self, parent: int, name: str, inode: int) -> None:
        """Add an entry; the name must be free."""

    def unlink(self, parent: int, name: str) -> None:
        """Drop an entry (the inode stays until ``Files.delete``); ``Conflict`` if it is gone."""

    def path_of(self, inode: int) -> str | None:
        """A path naming the inode, if it is linked."""


class Files(Protocol):
    """A file's content: its extents, and the reference each takes on its chunk."""

    def create_file(self, parent: int, name: str, file: NewFile) -> Inode:
        """A new file inode with its extents (a reference taken on each chunk), linked
        at ``name`` in ``parent`` (the name must be free): ``Tree.create``, ``set_extents``
        and ``Tree.link`` at once (one round trip where the engine is across a network)."""

    def create_files(self, files: Sequence[tuple[int, str, NewFile]]) -> list[Inode]:
        """``create_file`` for each ``(parent, name, file)``, in order (each name free):
        a statement per table for all of them where the engine is across a network."""

    def set_extents(self, inode: int, extents: Iterable[Extent]) -> None:
        """Attach extents to a new file inode, taking a reference on each chunk."""

    def extents(self, inode: int) -> list[Extent]:
        """A file's extents in file order."""

    def extents_page(self, inode: int, start: int, limit: int) -> list[Extent]:
        """At most ``limit`` extents of a file in order, the first covering offset ``start``."""

    def delete(self, inode: int) -> None:
        """Drop an inode and its extents, releasing its chunk references."""

    def chunk_users(self, chunk: str, after: int, limit: int) -> list[int]:
        """Up to ``limit`` inodes after ``after`` whose extents use the chunk, in order."""


class Chunks(Protocol):
    """The chunk layer: chunk rows, the nodes holding each copy, the bytes the engine keeps
    itself, and the collection of chunks no file uses."""

    def add_chunks(self, chunks: Iterable[StoredChunk]) -> None:
        """Record chunks (if new) and the nodes holding them, or the bytes of those the
        engine keeps itself (``data``)."""

    def inline(self, ids: Iterable[str]) -> dict[str, bytes]:
        """Of these chunk ids, those the engine keeps itself, with their bytes."""

    def referenced(self, ids: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """Of these chunk ids, those some file uses, with their replicas (none for a chunk
        the engine keeps itself)."""

    def known(self, ids: Iterable[str]) -> set[str]:
        """Of these chunk ids, those the chunk layer holds at all."""

    def replicas(self, ids: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """Nodes holding each chunk."""

    def named(self, ids: Iterable[str]) -> set[str]:
        """Of these chunk ids, those any table names (chunks, extents, replicas)."""

    def chunk_page(self, after: str, limit: int) -> tuple[list[ChunkRecord], str]:
        """Up to ``limit`` chunks with ids after ``after``, in id order, with their
        replicas; and the cursor of the next page (``""`` after the last).

        Rows that do not decode are left out (``Tx.inconsistencies`` names them).
        """

    def add_replicas(self, chunk: str, nodes: Iterable[str]) -> None:
        """Record more nodes holding a copy of a chunk."""

    def drop_replica(self, chunk: str, node: str) -> None:
        """Forget one node's copy of a chunk, or of a piece (``chunk`` is the piece's id)."""

    def degraded(self, alive: Iterable[str], limit: int) -> list[Degraded]:
        """Referenced chunks with fewer copies on ``alive`` nodes than their files want
        (never one the engine keeps itself and no node holds: it is as safe as the
        metadata)."""

    def forget_unreferenced(self, older_than_ns: int, limit: int) -> list[Forgotten]:
        """Delete up to ``limit`` chunk rows without references since before
        ``older_than_ns`` (and no extent naming them, and their bytes if the engine kept
        them); they and their former replicas, then the pieces of those kept
        erasure-coded that no other stripe uses, each with its node and the cutoff its
        files go under (the moment its chunk lost its last reference). Each is recorded
        in ``collected`` under that cutoff, and the store's totals of what was freed grow
        by them."""

    def orphaned(self, ids: Iterable[str], cutoff_ns: int) -> list[str]:
        """Of these chunk ids (files found on a node), those no metadata names, each
        recorded in ``collected`` under ``cutoff_ns`` before its files are deleted: a
        commit naming one later must show its copy written since, as after collection."""

    def collected(self, ids: Iterable[str]) -> dict[str, int]:
        """Of these chunk ids, those collection forgot lately, with the cutoff (ns) their
        copies were deleted under: a copy written before it may be gone."""

    def expire_collected(self, older_than_ns: int, limit: int) -> int:
        """Forget up to ``limit`` records of ``collected`` made before ``older_than_ns``."""

    def collection(self) -> Collection:
        """What waits to be collected (chunks no file uses, and their bytes on the nodes)
        and what collection has freed since the store was made."""


class Stripes(Protocol):
    """Storage classes set on inodes, and the pieces of chunks kept erasure-coded."""

    def set_class(self, inode: int, name: str) -> None:
        """Set the storage class of an inode (``""``: clear it)."""

    def classes(self, inodes: Iterable[int]) -> dict[int, str]:
        """Of these inodes, those with a class set, with its name."""

    def classed(self) -> list[tuple[int, str]]:
        """Every inode with a class set, by number: (inode, class name)."""

    def stripes(self, ids: Iterable[str]) -> dict[str, Stripe]:
        """Of these chunk ids, those kept erasure-coded, with their pieces."""

    def unstriped(self, inodes: Iterable[int], limit: int) -> list[ChunkRecord]:
        """Up to ``limit`` chunks these files use that nodes hold as copies (not striped
        yet), in id order, with the nodes holding them."""

    def stripe(self, chunk: str, stripe: Stripe) -> tuple[str, ...]:
        """Replace a chunk's copies with its stripe; the nodes whose copies it forgot (none
        if the chunk was striped already; ``Conflict`` if the chunk is gone)."""

    def short_stripes(self, alive: Iterable[str], limit: int) -> list[tuple[ChunkRef, Stripe]]:
        """Up to ``limit`` referenced striped chunks with a piece on no node of ``alive``."""

    def striped(self, pieces: Iterable[str]) -> dict[str, str]:
        """Of these ids, those that are pieces of a stripe, each with its chunk's id."""

    def place_piece(self, chunk: str, index: int, was: str, node: str) -> None:
        """Record that piece ``index`` of a chunk is now on ``node`` (if still on ``was``)."""


def tiling_problem(size: int, extents: Iterable[Extent]) -> str | None:
    """What is wrong with extents that should tile ``[0, size)`` in order, or ``None``."""
    end = 0
    for x in extents:
        if x.offset != end:
            return f"extents leave a gap or overlap at offset {end} (next starts at {x.offset})"
        if x.length <= 0 or x.chunk_offset < 0 or x.chunk_offset + x.length > x.chunk.length:
            return f"the extent at offset {x.offset} does not fit its chunk {x.chunk.id}"
        end += x.length
    if end != size:
        return f"extents cover {end} bytes but the file's size is {size}"
    return None
