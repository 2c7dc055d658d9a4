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

import msgspec

from .._errors import IntegrityError
from ..transport import KEY_LIFETIME_S
from ._repo import Repository, Tx

R = TypeVar("R")
PRUNE_EXTRA = 16
"""Old keys a recording write deletes beyond twice what it adds (catches up after a burst)."""


def write_once(repo: Repository, key: str, kind: Any, apply: Callable[[Tx], R]) -> R:
    """``apply`` in one write transaction; with a ``key``, at most once for that key (a
    repeat gets the first reply, decoded as ``kind``)."""

    def once(tx: Tx) -> R:
        if key and (done := tx.outcomes((key,))):
            replay: R = replayed(done[key], kind, key)
            return replay
        result = apply(tx)
        if key:
            record(tx, [(key, result)])
        return result

    return repo.transact(once)


def recorded(tx: Tx, keys: Iterable[str]) -> dict[str, bytes]:
    """The recorded replies of those of ``keys`` that were applied (empty keys: none)."""
    wanted = [key for key in keys if key]
    return tx.outcomes(wanted) if wanted else {}


def replayed(reply: bytes, kind: Any, key: str) -> Any:
    """A recorded reply as the value it was."""
    try:
        return msgspec.msgpack.decode(reply, type=kind)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise IntegrityError(
            f"metadata damaged: the recorded reply of request {key}: {exc}"
        ) from None


def record(tx: Tx, done: list[tuple[str, object]]) -> None:
    """Record each key's reply in ``tx``; prune keys past their lifetime."""
    now = time.time_ns()
    tx.record_outcomes(((key, msgspec.msgpack.encode(reply)) for key, reply in done), now)
    tx.forget_outcomes(now - int(KEY_LIFETIME_S * 1e9), 2 * len(done) + PRUNE_EXTRA)
