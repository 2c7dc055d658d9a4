"""Mutations applied once: idempotency keys recorded with their replies.

A remote client gives each mutation a key (``transport/_requests.py``) and
repeats the request with the same key when its reply does not come: the
connection broke, the metadata service died or stopped answering. The repeat
may reach the same service or another on the same engine. The service
records ``key -> encoded reply`` in the transaction that applies the
mutation, so the two commit together or not at all; a request whose key is
recorded gets the recorded reply and changes nothing. A mutation that fails
rolls back and records nothing, so its repeat runs again (and most likely
fails the same way). The check happens inside the write transaction, after
a repeat that races its first attempt through another service either finds
the key or meets it as a duplicate when it records its own, and then runs
again (the engine's ``transact``) and finds it.

A key is bound to its request: recorded with a fingerprint of what it
asked (``bind``: the request's kind and content, blake3 of its encoding), so
a key sent again with another request is refused (``InvalidArgument``, for
that request alone) rather than answered with the first one's reply.

Lifetime: a key is kept ``KEY_LIFETIME_S`` (10 minutes); clients stop
repeating a mutation well before (``RETRY_WITHIN_S``, half of it). Pruning
rides on the writes that record keys: each one that records ``n`` keys also
deletes up to ``2n + PRUNE_EXTRA`` keys past their lifetime, oldest first,
by an index on their age. So the table holds about one lifetime's keys
whatever the rate, never needs a background task, and an idle store keeps
its last keys until the next write, which is harmless.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import blake3
import msgspec

from .._errors import GrabenError, IntegrityError, InvalidArgument
from ..transport import KEY_LIFETIME_S
from ._repo import Repository, Tx

R = TypeVar("R")
PRUNE_EXTRA = 16
"""Old keys a recording write deletes beyond twice what it adds (catches up after a burst)."""


BOUND = b"K1"
"""How a recorded reply bound to its request starts: this, then the request's fingerprint."""
PRINT = 16
"""Bytes of a request's fingerprint."""
MAX_KEY = 128
"""Longest idempotency key a client may send."""


def bind(key: str, *request: object) -> str:
    """``key`` bound to ``request`` (its kind and content, the key left out): what
    ``write_once`` and ``commit_group`` take. ``""`` stays ``""`` (no key, no record)."""
    if not key:
        return ""
    if len(key) > MAX_KEY or not key.isprintable() or " " in key:
        raise InvalidArgument(
            f"an idempotency key is up to {MAX_KEY} printable characters, no spaces"
        )
    what = msgspec.msgpack.encode([type(r).__name__ for r in request] + list(request))
    return f"{key} {blake3.blake3(what).hexdigest(length=PRINT)}"


def write_once(repo: Repository, key: str, kind: Any, apply: Callable[[Tx], R]) -> R:
    """``apply`` in one write transaction; with a ``key`` (from ``bind``), at most once
    for that key (a repeat gets the first reply, decoded as ``kind``)."""

    def once(tx: Tx) -> R:
        if key and (done := recorded(tx, (key,))):
            replay: R = replayed(done[key_id(key)], kind, key)
            return replay
        result = apply(tx)
        if key:
            record(tx, [(key, result)])
        return result

    return repo.transact(once)


def recorded(tx: Tx, keys: Iterable[str]) -> dict[str, bytes]:
    """The recorded replies of those of ``keys`` (bound) that were applied, by key id."""
    wanted = [key_id(key) for key in keys if key]
    return tx.keys.outcomes(wanted) if wanted else {}


def replayed(reply: bytes, kind: Any, key: str) -> Any:
    """A recorded reply as the value it was, if it was ``key``'s own request's."""
    if reply.startswith(BOUND):  # older replies (before keys were bound) carry no print
        asked, reply = reply[len(BOUND) : len(BOUND) + PRINT], reply[len(BOUND) + PRINT :]
        if asked.hex() != key.partition(" ")[2]:
            raise misused(key, "first sent with another request")
    try:
        return msgspec.msgpack.decode(reply, type=kind)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise IntegrityError(
            f"metadata damaged: the recorded reply of request {key_id(key)}: {exc}"
        ) from None


def replayed_or_error(reply: bytes, kind: Any, key: str) -> Any:
    """``replayed``, or the error that stands for it: one bad key must fail its own
    request, never a group it shares a transaction with."""
    try:
        return replayed(reply, kind, key)
    except GrabenError as exc:
        return exc


def record(tx: Tx, done: list[tuple[str, object]]) -> None:
    """Record each (bound) key's reply in ``tx``; prune keys past their lifetime."""
    now = time.time_ns()
    tx.keys.record_outcomes(((key_id(key), _stored(key, reply)) for key, reply in done), now)
    tx.keys.forget_outcomes(now - int(KEY_LIFETIME_S * 1e9), 2 * len(done) + PRUNE_EXTRA)


def _stored(key: str, reply: object) -> bytes:
    encoded = msgspec.msgpack.encode(reply)
    _, _, fingerprint = key.partition(" ")
    return BOUND + bytes.fromhex(fingerprint) + encoded if fingerprint else encoded


def misused(key: str, how: str) -> InvalidArgument:
    """The error for a key sent with more than one request (``how``: when)."""
    return InvalidArgument(
        f"idempotency key {key_id(key)} was {how}; a key names one request "
        "(make a new one for each)"
    )


def key_id(key: str) -> str:
    """The key a client sent, without the fingerprint ``bind`` added."""
    return key.partition(" ")[0]
