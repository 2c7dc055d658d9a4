"""Which store a data directory belongs to (its ``store-id`` file), and whether its chunk
files are encrypted, under which key (its ``sealed`` file).

The first line is the store's id. A directory that took its id (from a
metadata service's answer, or an embedded store's ``meta.db``) while chunk
files were already there has ``adopted`` on a second line: nothing shows
those chunks are that store's, so collection deletes none of its orphans
until someone vouches for them (``fsck --collect --force``).
"""

from __future__ import annotations

import hmac
from pathlib import Path

from .._errors import PermissionDenied
from ._chunkstore import LocalChunkStore, write_private
from ._sealed import MARK, Sealer

ADOPTED = "adopted"


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


def seal_directory(root: Path, sealer: Sealer | None, holds_chunks: bool) -> None:
    """Check, or record on first use, whether ``root``'s chunk files are sealed and with
    which key; ``PermissionDenied`` for a node started without the key its files need,
    with another, or with a key over plaintext files already there."""
    mark = root / MARK
    try:
        said = mark.read_text().strip()
    except FileNotFoundError:
        if sealer is not None and holds_chunks:
            raise PermissionDenied(
                f"{root} holds chunk files that are not encrypted: encryption at rest is "
                "chosen when a store is made"
            ) from None
        write_private(mark, (sealer.check if sealer is not None else "none") + "\n")
        return
    if said == "none" and sealer is None:
        return
    if said == "none":
        raise PermissionDenied(f"{root} holds chunk files that are not encrypted; no key needed")
    if sealer is None:
        raise PermissionDenied(
            f"{root} holds encrypted chunk files: give the store's key "
            "(--encryption-key-file, or $GRABEN_ENCRYPTION_KEY_FILE)"
        )
    if not hmac.compare_digest(said, sealer.check):
        raise PermissionDenied(f"{root}'s chunk files were encrypted under another key")
