"""Where a chunk's replicas go: rack-aware, weighted rendezvous hashing.

Every eligible node draws a score from a hash of ``(key, node id)`` scaled by
its free bytes, ``-free / ln(u)`` (Resch's weighted highest-random-weight).
The best score wins with probability ``free / total free``, and a node's score
does not depend on any other node, so nodes joining or leaving move only the
chunks they win or held.

Racks are spread in rounds: each rack's best node, then each rack's second
best, and so on, every round ordered by score. Taking the first
``replication`` nodes of that order puts replicas on distinct racks while
there are enough, and never gives a rack a second replica before every rack
has one. An embedded store has one node, ``LOCAL_NODE``, which holds every
chunk.

Pure: no I/O, no clock, no randomness beyond the hash.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from typing import Literal, Protocol

from .._config import RESERVE
from .._errors import CannotPlace, InvalidArgument, NoSpace

LOCAL_NODE = "local"
"""The one node id of an embedded store."""

Reason = Literal["dead", "draining", "excluded", "full"]
_REASONS: tuple[Reason, ...] = ("dead", "draining", "excluded", "full")


class Candidate(Protocol):
    """What placement reads of a node (``_types.NodeState`` has these and more)."""

    @property
    def id(self) -> str: ...
    @property
    def rack(self) -> str: ...
    @property
    def free(self) -> int: ...
    @property
    def alive(self) -> bool: ...


def place(
    nodes: Sequence[Candidate],
    replication: int,
    key: str,
    length: int,
    exclude: Collection[str] = (),
    minimum: int | None = None,
) -> tuple[str, ...]:
    """Node ids for the replicas of one chunk, best first.

    ``key`` names the chunk (its id); ``length`` is its size in bytes. Only
    alive nodes in service (not draining: a ``state`` of ``""``, see
    ``meta/_drain.py``) not in ``exclude`` with ``free >= length + RESERVE`` are
    eligible. The result depends only on the arguments, not on the order of
    ``nodes``. With fewer eligible nodes than ``replication`` but at least
    ``minimum`` (default: ``replication``), it names them all: a degraded
    write, which repair tops up later.

    Raises ``InvalidArgument`` for ``replication < 1``, a negative ``length``
    or a repeated node id; ``NoSpace`` when enough nodes are up but too few
    have room; ``CannotPlace`` when too few are up (dead or excluded).
    """
    _check(nodes, replication, length)
    least = replication if minimum is None else max(1, min(minimum, replication))
    excluded = frozenset(exclude)
    eligible = [n for n in nodes if _reason(n, length, excluded) is None]
    if len(eligible) < least:
        raise _shortage(nodes, least, length, excluded, len(eligible))
    return tuple(n.id for n in _in_rounds(_by_score(eligible, key))[:replication])


def _check(nodes: Sequence[Candidate], replication: int, length: int) -> None:
    if replication < 1:
        raise InvalidArgument(f"replication must be at least 1, not {replication}")
    if length < 0:
        raise InvalidArgument(f"chunk length must not be negative, not {length}")
    repeated = sorted(i for i, c in Counter(n.id for n in nodes).items() if c > 1)
    if repeated:
        raise InvalidArgument(f"node ids must be unique, repeated: {', '.join(repeated)}")


def _reason(node: Candidate, length: int, excluded: frozenset[str]) -> Reason | None:
    """Why a node cannot take the chunk, or ``None`` if it can (first reason wins)."""
    if not node.alive:
        return "dead"
    if getattr(node, "state", ""):  # NodeState has one; a bare Candidate may not
        return "draining"
    if node.id in excluded:
        return "excluded"
    if node.free < length + RESERVE:
        return "full"
    return None


def _by_score(eligible: list[Candidate], key: str) -> list[Candidate]:
    """Eligible nodes, highest score first; ties (practically never) broken by id."""
    # Length-prefix the key so no (key, id) pair hashes like another.
    encoded = key.encode()
    seed = hashlib.blake2b(len(encoded).to_bytes(8, "big") + encoded, digest_size=8)
    scores = {n.id: _score(seed, n) for n in eligible}
    return sorted(eligible, key=lambda n: (-scores[n.id], n.id))


def _score(seed: hashlib.blake2b, node: Candidate) -> float:
    """``-free / ln(u)``, ``u`` uniform in (0, 1) from the hash of (key, node id)."""
    h = seed.copy()
    h.update(node.id.encode())
    # 52 bits make (2m + 1) / 2**53 exact in a double and strictly inside (0, 1),
    # so ln(u) is never 0.
    m = int.from_bytes(h.digest(), "big") >> 12
    return -node.free / math.log((2 * m + 1) / 2**53)


def _in_rounds(by_score: list[Candidate]) -> list[Candidate]:
    """Each rack's best node, then each rack's second best, ...; by score within a round."""
    seen: Counter[str] = Counter()
    rounds: list[tuple[int, int]] = []
    for position, node in enumerate(by_score):
        rounds.append((seen[node.rack], position))
        seen[node.rack] += 1
    return [by_score[position] for _, position in sorted(rounds)]


def _shortage(
    nodes: Sequence[Candidate],
    replication: int,
    length: int,
    excluded: frozenset[str],
    eligible: int,
) -> CannotPlace | NoSpace:
    """The error for too few eligible nodes, saying why the others are not (and which)."""
    why = {n.id: _reason(n, length, excluded) for n in nodes}
    reasons = Counter(why.values())
    message = (
        f"cannot place {_count(replication, 'replica')} of a {length}-byte chunk: "
        f"need {_count(replication, 'node')}, {eligible} of {len(nodes)} eligible"
        f"; {_explain(reasons, length)}{_which(nodes, why)}"
    )
    # Only disks are missing if the full nodes would make up the shortfall:
    # that is ENOSPC, not a cluster that is down.
    if eligible + reasons["full"] >= replication:
        return NoSpace(message)
    return CannotPlace(message)


def _which(nodes: Sequence[Candidate], why: dict[str, Reason | None]) -> str:
    """The nodes that could not take it, by reason: ``; dead: n1 (host:port)``."""
    parts = []
    for reason in ("dead", "draining", "full"):
        named = [_name(n) for n in nodes if why[n.id] == reason]
        if named:
            parts.append(f"{reason}: {', '.join(sorted(named)[:10])}")
    return "".join(f"; {p}" for p in parts)


def _name(node: Candidate) -> str:
    address = getattr(node, "address", "")  # NodeState has one; a bare Candidate may not
    return f"{node.id} ({address})" if address else node.id


def _explain(reasons: Counter[Reason | None], length: int) -> str:
    room = {"full": f" (less than {length + RESERVE} bytes free)"}
    parts = [f"{reasons[r]} {r}{room.get(r, '')}" for r in _REASONS if reasons[r]]
    return ", ".join(parts) or "no others: too few nodes"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def live_first(
    replicas: dict[str, tuple[str, ...]], nodes: Iterable[Candidate]
) -> dict[str, tuple[str, ...]]:
    """Each chunk's copies with those on nodes that stopped heartbeating last (a reader
    asks them in order); the rest keep their order."""
    dead = {n.id for n in nodes if not n.alive}
    if not dead:
        return replicas
    return {c: tuple(sorted(r, key=dead.__contains__)) for c, r in replicas.items()}
