"""Chunk files encrypted at rest: AES-256-GCM with the store's key.

A sealed chunk file is ``salt (8 random bytes)`` then, for each 1 MiB
segment of the chunk, ``ciphertext | tag (16 bytes)``; a segment's nonce is
the salt and its number, and its tag also covers the chunk's id, the
segment's number and how many there are. So a file renamed to another id,
cut short, with segments swapped or a byte changed anywhere fails a tag
instead of reading wrong; and segments seal and open side by side on every
core (one GCM stream runs on one). A new salt per file write: two writes
share a nonce only if their 64 random bits meet (about one in 2^25 after a
million files under one key). Ids stay the blake3 of the plaintext, so a
store still deduplicates what it holds; what the ciphertext says of the
bytes is only their length.

The key (32 bytes) is the store's: every data node of a cluster and an
embedded store take it from a file (``--encryption-key-file`` or
``$GRABEN_ENCRYPTION_KEY_FILE``). A data directory records whether its files
are sealed and a check value of the key in ``ROOT/sealed``
(``_identity.seal_directory``), so a node started without the key, or with another,
refuses to start rather than serve garbage or mix plaintext into a sealed
store; the store's engine records the same (``_identity.check_sealing``), so
a directory that lost its record is still refused, and an encrypted store
keeps no small file's bytes in its engine (docs/cluster.md, "Encryption at
rest", says what stays plaintext).

cryptography's ``update_into`` writes into the caller's buffers and lets go
of the GIL: 5.6 GB/s decrypting on one core here, one copy of the bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from .._errors import IntegrityError, InvalidArgument, MissingExtra, PermissionDenied

SALT = 8
"""Random bytes at the head of a sealed file: each segment's nonce is these and its number."""
TAG = 16
SEGMENT = 1 << 20
"""Plaintext bytes sealed under one nonce and tag: segments open side by side, on every core."""
_SLACK = 15
"""``update_into`` wants its output this much longer than its input (AES's block, less 1)."""
HELPERS = max(1, (os.cpu_count() or 1) - 1)
"""Threads of the pool that help this one seal or open a chunk's segments."""
MARK = "sealed"
"""The file in a data directory that says whether its chunk files are sealed."""


def sealed_length(length: int) -> int:
    """Bytes of the sealed file of a ``length``-byte chunk."""
    return SALT + length + TAG * _segments(length)


def plain_length(sealed: int) -> int:
    """The chunk's length behind a sealed file of ``sealed`` bytes (-1: no such length)."""
    segments = max(1, -(-(sealed - SALT) // (SEGMENT + TAG)))
    length = sealed - SALT - TAG * segments
    return length if length >= 0 and sealed_length(length) == sealed else -1


def _segments(length: int) -> int:
    return max(1, -(-length // SEGMENT))


class Sealer:
    """Seals and opens chunk files with one store's key."""

    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise InvalidArgument(f"an encryption key is 32 bytes (AES-256), not {len(key)}")
        try:
            from cryptography.hazmat.primitives.ciphers import algorithms
        except ImportError:
            why = "encryption at rest needs cryptography: pip install 'graben[encrypt]'"
            raise MissingExtra(why) from None
        self._algorithm: Any = algorithms.AES(key)
        self.check = hmac.new(key, b"graben chunk files", hashlib.sha256).hexdigest()[:32]
        """What ``ROOT/sealed`` records of the key: tells a wrong key, reveals nothing."""

    def seal(
        self,
        chunk_id: str,
        data: memoryview,
        pool: Executor | None = None,
        out: memoryview | None = None,
    ) -> memoryview:
        """The sealed file's bytes for a chunk (segments sealed side by side on ``pool``),
        in ``out`` if given (at least ``sealed_length + 15`` bytes: a buffer kept for it)."""
        salt = os.urandom(SALT)
        if out is None:
            out = memoryview(bytearray(sealed_length(data.nbytes) + _SLACK))
        out[:SALT] = salt
        jobs = [(i, *_spans(data.nbytes, i)) for i in range(_segments(data.nbytes))]

        def one(i: int, start: int, n: int, at: int) -> None:
            encryptor = self._cipher(salt, i).encryptor()
            encryptor.authenticate_additional_data(_aad(chunk_id, i, len(jobs)))
            encryptor.update_into(data[start : start + n], out[at : at + n + _SLACK])
            encryptor.finalize()
            out[at + n : at + n + TAG] = encryptor.tag

        _each(one, jobs, pool)
        return out[: sealed_length(data.nbytes)]

    def open(
        self,
        chunk_id: str,
        sealed: memoryview,
        into: memoryview,
        pool: Executor | None = None,
    ) -> None:
        """Fill ``into`` (the chunk's length) from a sealed file's bytes, or raise
        ``IntegrityError`` if they are not what was sealed under this id and key."""
        from cryptography.exceptions import InvalidTag

        if sealed.nbytes != sealed_length(into.nbytes):
            raise IntegrityError(f"sealed chunk {chunk_id} has the wrong length")
        salt = bytes(sealed[:SALT])
        jobs = [(i, *_spans(into.nbytes, i)) for i in range(_segments(into.nbytes))]

        def one(i: int, start: int, n: int, at: int) -> None:
            tag = bytes(sealed[at + n : at + n + TAG])
            decryptor = self._cipher(salt, i, tag).decryptor()
            decryptor.authenticate_additional_data(_aad(chunk_id, i, len(jobs)))
            # Released on the way out, failing or not: ``sealed`` may be a mapped file,
            # which cannot be unmapped while a view of it lives on (in a traceback's frame).
            with sealed[at : at + n] as body, into[start : start + n] as dest:
                head = max(0, n - _SLACK)  # straight into ``into`` but for the last bytes
                if head:
                    decryptor.update_into(body[:head], dest[: head + _SLACK])
                if n > head:
                    rest = bytearray(n - head + _SLACK)
                    decryptor.update_into(body[head:], rest)
                    dest[head:] = rest[: n - head]
            try:
                decryptor.finalize()
            except InvalidTag:
                failed.append(i)

        failed: list[int] = []
        _each(one, jobs, pool)
        if failed:
            raise IntegrityError(
                f"chunk {chunk_id} fails its authentication tag in segment {min(failed)} of "
                f"{len(jobs)} (damaged, renamed, or sealed under another key)"
            )

    def _cipher(self, salt: bytes, index: int, tag: bytes | None = None) -> Any:
        from cryptography.hazmat.primitives.ciphers import Cipher, modes

        nonce = salt + index.to_bytes(4, "big")
        return Cipher(self._algorithm, modes.GCM(nonce, tag))


def _spans(length: int, index: int) -> tuple[int, int, int]:
    """Segment ``index``'s plaintext start and length, and where it starts sealed."""
    start = index * SEGMENT
    return start, min(SEGMENT, length - start), SALT + start + index * TAG


def _aad(chunk_id: str, index: int, count: int) -> bytes:
    """What a segment's tag binds besides its bytes: the chunk, its place, how many there
    are (a file cut short, or segments swapped, fails)."""
    return f"{chunk_id}:{index}:{count}".encode()


def _each(
    one: Callable[..., None], jobs: list[tuple[int, int, int, int]], pool: Executor | None
) -> None:
    """``one(*job)`` for each job, taken in turn by this thread and by helpers on ``pool``
    (one per other core): however many threads ``pool`` has, the work comes out even."""
    if pool is None or len(jobs) == 1:
        for job in jobs:
            one(*job)
        return
    lock, left = threading.Lock(), iter(jobs)

    def take() -> None:
        while True:
            with lock:
                job = next(left, None)
            if job is None:
                return
            one(*job)

    helpers = [pool.submit(take) for _ in range(min(len(jobs) - 1, HELPERS))]
    try:
        take()
    finally:
        errors = [f.exception() for f in helpers]
    for error in errors:
        if error is not None:
            raise error


def load_key(path: Path) -> Sealer:
    """The sealer of the key in ``path``: 32 raw bytes, or 64 hex digits (a newline may
    follow); the file must be the owner's alone, as the cluster secret's."""
    try:
        st = path.stat()
        raw = path.read_bytes()
    except OSError as exc:
        raise InvalidArgument(
            f"cannot read the encryption key file {path}: {exc.strerror}"
        ) from None
    if st.st_mode & 0o077:
        raise PermissionDenied(
            f"the encryption key file {path} is readable by others: chmod 600 it"
        )
    text = raw.strip()
    if len(text) == 64:
        try:
            return Sealer(bytes.fromhex(text.decode()))
        except (ValueError, UnicodeDecodeError):
            pass
    return Sealer(raw)
