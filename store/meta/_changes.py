"""The change feed: every path a write changes, numbered, in the engine.

Each namespace write adds a row per path it changed, in its own transaction:
the path, and the store inode and ctime there after it (0: no name left). A
created, rewritten or chmod'ed file names itself; a rename its source (0) and
its destination; a removal its path (0: whatever was below a directory went
with it). A mount follows the feed (``Changes``) to drop what the kernel
holds of paths others changed, and knows its own writes by their inode and
ctime: it saw them already.

Rows are numbered by the engine as they are written, so on PostgreSQL a
transaction that took its number first may commit after a later one: a
reader keeps the numbers it has not seen below the last it has
(``missing``) and asks for them again, for as long as a transaction can
last. Rows go after ``KEPT_S``; a reader behind the oldest kept row has
missed changes and must drop what it holds.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

from .._types import ChangeFeed
from ..transport._replies import LIST_PAGE, MAX_PAGE
from ._repo import Inode, Repository, Tx

KEPT_S = 300.0
"""How long a row stays: past any kernel cache a mount keeps, and any pause of its own."""
PRUNE_ONE_IN = 16
"""Writes prune old rows one time in this many, a few times their own rows each time."""
PRUNE_ROWS = 256


def changed(tx: Tx, *paths: tuple[str, Inode | None]) -> None:
    """Record each (path, what is there now) in ``tx``'s transaction."""
    rows = [(p, 0, 0) if n is None else (p, n.id, n.ctime_ns) for p, n in paths]
    changed_rows(tx, rows)


def changed_rows(tx: Tx, rows: Sequence[tuple[str, int, int]]) -> None:
    """Record (path, inode, ctime_ns) rows; now and then, forget the oldest."""
    now = time.time_ns()
    tx.feed.record_changes(rows, now)
    if random.randrange(PRUNE_ONE_IN) == 0:
        tx.feed.forget_changes(now - int(KEPT_S * 1e9), PRUNE_ROWS + PRUNE_ONE_IN * len(rows))


def feed(repo: Repository, after: int, missing: Sequence[int], limit: int) -> ChangeFeed:
    """The rows numbered after ``after`` and the ``missing`` ones still kept."""
    with repo.read() as tx:
        oldest, newest = tx.feed.change_bounds()
        if after < 0:
            return ChangeFeed((), newest, oldest)
        page = min(limit or LIST_PAGE, MAX_PAGE)
        rows = tx.feed.changes_after(after, missing[:MAX_PAGE], page)
    return ChangeFeed(tuple(rows), newest, oldest)
