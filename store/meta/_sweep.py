"""The leader's sweep of the nodes' chunk files: orphans go by themselves too.

A chunk file no metadata names is an orphan: the copies of an upload whose
writer died before its commit, a copy a node held while it was down when
collection forgot its chunk, the files a restored metadata never knew. A duty
beside collection (``MetaService._duties``), with no command: each round, only
while leading, reads a few pages of one node's inventory (the nodes in turn);
at the end of a node's pass it deletes the orphans last written more than
``grace_s`` ago. By default that is a writer's receipt life, after which no
commit can name a file it wrote; and a new upload of the same bytes rewrites
the file, which the node's delete (under the cutoff) spares. Before deleting,
one engine transaction under the lease's fence takes the ids still named by no
metadata and records them in ``collected`` under the cutoff, so a commit that
names one of them afterwards must show its copy was written since (as after
collection: ``meta/_commits.py``), which makes a shorter grace safe as well.

Nothing is deleted from a node that took its store id over chunk files already
there (nothing shows they are this store's: ``fsck --collect --force`` vouches
for them), nor when more of a node's files are orphans than crashed writers
leave (``too_many_orphans``: over 10% of them and 64): that is what a wrong
or an old metadata database looks like. Orphans that a restore explains
(written after the backup) or that collection forgot and could not delete do
not count. Each refusal is logged once a pass, naming fsck.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._config import too_many_orphans
from .._errors import GrabenError, InvalidArgument
from ..transport import RemoteChunks
from ..wire import Metrics, auth
from ._chunks import ChunkRecords
from ._collect import Run, delete_copies

log = logging.getLogger("graben.meta")
SWEEP_GRACE_S = auth.RECEIPT_TTL_S
"""How old an orphan chunk file must be before the sweep deletes it, by default."""
PASS_EVERY_S = 3600.0
"""How often each node's files are swept at most (a quarter of a shorter grace)."""
PAGES_PER_ROUND = 4
"""Inventory pages a round reads: a node of millions of chunks takes many rounds."""
MOST_FOUND = 100_000
"""Orphans one pass remembers; a node holding more is fsck's (the pass stops)."""


@dataclass
class _Pass:
    """One node's pass so far."""

    node: str
    after: str = ""
    held: int = 0
    found: list[tuple[str, float]] = field(default_factory=list)
    """(chunk id, mtime) of each file no metadata named when its page was read."""


class Sweep:
    """The orphan sweep's rounds (see the module docstring)."""

    def __init__(
        self,
        records: ChunkRecords,
        chunks: RemoteChunks,
        run: Run,
        fence: Callable[[], int],
        store: Callable[[], str],
        restored: Callable[[], int],
        *,
        grace_s: float = SWEEP_GRACE_S,
        metrics: Metrics | None = None,
    ) -> None:
        if not grace_s >= 0:
            raise InvalidArgument(f"the orphan grace must be 0 s or more, not {grace_s}")
        self._records, self._chunks, self._run, self._fence = records, chunks, run, fence
        self._store, self._restored = store, restored
        self.grace_s = grace_s
        self._every_s = min(PASS_EVERY_S, grace_s / 4)
        self._swept_at: dict[str, float] = {}
        """Node -> when its last pass ended (monotonic)."""
        self._pass: _Pass | None = None
        self._deleted = None if metrics is None else _counter(metrics)

    async def once(self) -> int:
        """A round's pages of one node's pass; the orphans deleted (at a pass's end)."""
        if self._pass is None:
            self._pass = await self._next()
            if self._pass is None:
                return 0
        sweep = self._pass
        try:
            for _ in range(PAGES_PER_ROUND):
                page = await self._chunks.inventory(sweep.node, self._store(), sweep.after)
                if not page:
                    return await self._end(sweep)
                await self._read(sweep, page)
                if len(sweep.found) > MOST_FOUND:
                    log.warning(
                        "data node %s holds over %d chunk files no metadata names: not "
                        "swept (graben fsck lists them; fsck --collect deletes them)",
                        sweep.node,
                        MOST_FOUND,
                    )
                    self._done(sweep)
                    return 0
        except GrabenError as exc:  # a node down or not answering: its turn comes again
            log.info("orphan sweep of data node %s put off: %s", sweep.node, exc.message)
            self._done(sweep)
        return 0

    async def _next(self) -> _Pass | None:
        """The node whose pass is due longest, if any is."""
        now = time.monotonic()
        due = [
            n
            for n in await self._chunks.nodes()
            if now - self._swept_at.get(n, -self._every_s) >= self._every_s
        ]
        if not due:
            return None
        return _Pass(min(due, key=lambda n: self._swept_at.get(n, -self._every_s)))

    async def _read(self, sweep: _Pass, page: list[tuple[str, float]]) -> None:
        sweep.held += len(page)
        sweep.after = page[-1][0]
        named = await self._run(self._records.known, [c for c, _ in page])
        sweep.found += [(c, mtime) for c, mtime in page if c not in named]

    def _done(self, sweep: _Pass) -> None:
        self._swept_at[sweep.node] = time.monotonic()
        self._pass = None

    async def _end(self, sweep: _Pass) -> int:
        """Delete the pass's old orphans, unless the node's files cannot be vouched for."""
        self._done(sweep)
        cutoff = time.time() - self.grace_s
        old = [(c, mtime) for c, mtime in sweep.found if mtime < cutoff]
        if not old or not await self._trusted(sweep, old):
            return 0
        doomed = await self._run(self._records.sweep, [c for c, _ in old], cutoff, self._fence())
        outcomes = await delete_copies(self._chunks, [(sweep.node, c, cutoff) for c in doomed])
        gone = outcomes.count(True)  # one not reached: the next pass tries again
        try:
            temporaries, _ = await self._chunks.clean(sweep.node, self._store(), cutoff)
        except GrabenError:
            temporaries = 0
        if gone or temporaries:
            log.info(
                "swept data node %s: %d orphan chunk files and %d temporaries older than "
                "%g s deleted (of %d files)",
                sweep.node,
                gone,
                temporaries,
                self.grace_s,
                sweep.held,
            )
        if self._deleted is not None:
            self._deleted.inc(gone)
        return int(gone)

    async def _trusted(self, sweep: _Pass, old: list[tuple[str, float]]) -> bool:
        """Whether the node's orphans may go: its files are shown this store's, and no
        more of them are unexplained than crashed writers leave."""
        if await self._chunks.adoption(sweep.node, self._store()):
            log.warning(
                "data node %s took its store id over chunk files already there: its %d "
                "orphans are not swept (graben fsck --collect --force vouches for them)",
                sweep.node,
                len(old),
            )
            return False
        restored = await self._run(self._restored) / 1e9
        explained = await self._run(self._records.explained, [c for c, _ in old])
        unexplained = [
            c for c, mtime in old if c not in explained and not (restored and mtime >= restored)
        ]
        if too_many_orphans(len(unexplained), sweep.held):
            log.warning(
                "not sweeping data node %s: %d of its %d chunk files are named by no "
                "metadata: is this the store's right metadata database, restored whole? "
                "(graben fsck lists them; fsck --collect --force deletes them)",
                sweep.node,
                len(unexplained),
                sweep.held,
            )
            return False
        return True


def _counter(metrics: Metrics) -> Any:
    return metrics.counter(
        "graben_sweep_deleted_chunks",
        "Orphan chunk files (named by no metadata) the leader's sweep deleted",
    )
