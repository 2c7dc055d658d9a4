"""Which store a data directory belongs to (its ``store-id`` file), and whether its chunk
files are encrypted, under which key (its ``sealed`` file, and the store's engine: a
directory's record may be lost, the engine's decides).

The first line is the store's id. A directory that took its id (from a
metadata service's answer, or an embedded store's ``meta.db``) while chunk
files were already there has ``adopted`` on a second line: nothing shows
those chunks are that store's, so collection deletes none of its orphans
until someone vouches for them (``fsck --collect --force``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from .._errors import IntegrityError, PermissionDenied
from .._hashing import content_id
from ._chunkstore import LocalChunkStore, write_private
from ._sealed import MARK, Sealer, plain_length

log = logging.getLogger("graben.node")
ADOPTED = "adopted"
PROBES = 4
"""Chunk files read to tell how a directory's files are encrypted when its record is gone."""
KEY_FLAGS = "--encryption-key-file, or $GRABEN_ENCRYPTION_KEY_FILE"


def read_id(path: Path) -> str | None:
    """An id kept in a small file (its first line), or ``None`` if there is none yet."""
    try:
        words = path.read_text().split()
    except FileNotFoundError:
        return None
    return words[0] if words else None


def keep_store_id(root: Path, store: str, chunks: LocalChunkStore) -> bool:
    """Write ``root/store-id`` for ``store``, adopted if ``chunks`` already holds chunk
    files; whether it was."""
    adopted = bool(chunks.inventory(limit=1))
    write_private(root / "store-id", f"{store}\n{ADOPTED}\n" if adopted else f"{store}\n")
    return adopted


def adoption(root: Path, *, vouch: bool = False) -> bool:
    """Whether ``root``'s chunk files predate its ``store-id``; ``vouch``: they are its
    store's after all (an operator said so), drop the mark first."""
    path = root / "store-id"
    try:
        words = path.read_text().split()
    except FileNotFoundError:
        return False
    if words[1:2] != [ADOPTED]:
        return False
    if vouch:
        write_private(path, words[0] + "\n")
        return False
    return True


def seal_directory(root: Path, sealer: Sealer | None, chunks: LocalChunkStore) -> None:
    """Check, or record, whether ``root``'s chunk files are sealed and with which key;
    ``PermissionDenied`` for a node started without the key its files need, with
    another, or with a key over plaintext files already there.

    The record binds while there are chunk files to protect: without any, it is made
    again for the key given (the store's engine decides then: ``check_sealing``). One
    removed while there are chunk files is made again from what a few of them turn
    out to be: plaintext, sealed under this key, or neither (refused)."""
    mark, mine = root / MARK, _check_of(sealer)
    held = [chunk_id for chunk_id, _ in chunks.inventory(limit=PROBES)]
    try:
        said = mark.read_text().strip()
    except FileNotFoundError:
        said = _found_in(chunks, sealer, held) if held else mine
        if said == mine:
            if held:
                log.warning("%s lost its %s file; its chunk files say: %s", root, MARK, mine)
            write_private(mark, mine + "\n")
            return
    if said == mine:
        return
    if not held:
        write_private(mark, mine + "\n")
        return
    raise PermissionDenied(_refusal(root, said, sealer))


def _refusal(root: Path, said: str, sealer: Sealer | None) -> str:
    """Why ``root``'s chunk files (``said``: sealed under this check value, ``"none"``,
    or ``""``: neither plaintext nor this key's) cannot be served with ``sealer``."""
    if said == "none":
        return (
            f"{root} holds chunk files that are not encrypted: encryption at rest is chosen "
            "when a store is made; no key needed"
        )
    if sealer is None and said:
        return f"{root} holds encrypted chunk files: give the store's key ({KEY_FLAGS})"
    if sealer is None:
        return (
            f"{root} holds chunk files that do not hash to their names: encrypted (its "
            f"{MARK} file, which said so, is gone) or damaged; give the store's key ({KEY_FLAGS})"
        )
    if said:
        return f"{root}'s chunk files were encrypted under another key"
    return (
        f"{root}'s chunk files neither hash to their names nor open under this key (its "
        f"{MARK} file, which said how they were encrypted, is gone): another key's, or damaged"
    )


def _found_in(chunks: LocalChunkStore, sealer: Sealer | None, held: list[str]) -> str:
    """What chunk files ``held`` are: ``"none"`` if one is plaintext (hashes to its name),
    ``sealer``'s check value if one opens under it, else ``""``."""
    for chunk_id in held:
        try:
            data = memoryview(chunks.path(chunk_id).read_bytes())
        except FileNotFoundError:
            continue  # collected meanwhile
        if content_id(data) == chunk_id:
            return "none"
        if sealer is not None and _opens(sealer, chunk_id, data):
            return sealer.check
    return ""


def _opens(sealer: Sealer, chunk_id: str, data: memoryview) -> bool:
    plain = memoryview(bytearray(max(0, plain_length(data.nbytes))))
    try:
        sealer.open(chunk_id, data, plain)
    except IntegrityError:
        return False
    return content_id(plain) == chunk_id


def check_sealing(what: str, recorded: str, sealer: Sealer | None) -> None:
    """``PermissionDenied`` unless ``sealer`` (or none) is the store's encryption at rest as
    its engine ``recorded`` it (a check value, ``"none"``, or ``""``: nothing yet). A store
    that is encrypted stays so: whatever ``what`` (a node, an embedded store) holds locally
    may be lost, the engine's record is the store's."""
    mine = _check_of(sealer)
    if recorded in ("", mine):
        return
    if recorded == "none":
        why = (
            "the store's chunk files are not encrypted (its metadata engine records it; "
            "encryption at rest is chosen when a store is made): start it without a key"
        )
    elif sealer is None:
        why = (
            "the store's chunk files are encrypted at rest (its metadata engine records "
            f"it): give the store's key ({KEY_FLAGS}) rather than write plaintext into it"
        )
    else:
        why = "the store's chunk files are encrypted under another key (its engine says so)"
    raise PermissionDenied(f"{what}: {why}")


def _check_of(sealer: Sealer | None) -> str:
    """What a data directory and the store's engine record of ``sealer``."""
    return sealer.check if sealer is not None else "none"
