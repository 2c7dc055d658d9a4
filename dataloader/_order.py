"""Which sample each rank and worker reads, and in what order: a pure core.

One epoch's global order depends only on ``(seed, epoch)`` and the manifest:
the shards are shuffled, then the groups within each shard (Parquet row
groups, runs of records: the unit a reader decodes), then the samples within
each group, so a reader holds one group at a time. Position ``p`` of the
epoch goes to rank ``p % world_size``, so after every rank has read ``k``
samples the first ``k * world_size`` positions are done, whatever the world
size; a job resumed on another world size carries on from there with nothing
read twice and nothing skipped. Every rank reads the same number of samples:
the order is padded by wrapping round to its start, or cut (the user's
choice), so no rank waits for a batch that never comes. Within a rank,
DataLoader workers take turns by ``worker_batch`` samples, the way the
DataLoader collects their batches, so the rank still sees its order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from graben.store import InvalidArgument


@dataclass(frozen=True, slots=True)
class Plan:
    """One epoch's order for a whole job."""

    groups: Sequence[Sequence[int]]
    """Samples in each group of each shard, in manifest order."""
    seed: int
    epoch: int
    shuffle: bool = True

    @property
    def total(self) -> int:
        """Samples in the dataset."""
        return sum(sum(g) for g in self.groups)

    def global_order(self) -> np.ndarray:
        """Every sample of the epoch once, as ``(shard, row, group)`` triples in reading order.

        ``row`` counts from the shard's start, ``group`` is the row's group in its shard.
        """
        rng = np.random.default_rng([self.seed, self.epoch])
        pieces = []
        for shard in self._shuffled(rng, len(self.groups)):
            sizes = self.groups[shard]
            starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
            for group in self._shuffled(rng, len(sizes)):
                rows = starts[group] + self._shuffled(rng, sizes[group])
                pieces.append(_triples(shard, rows, group))
        if not pieces:
            return np.zeros((0, 3), dtype=np.int64)
        return np.concatenate(pieces)

    def per_rank(self, world_size: int, *, start: int = 0, drop_last: bool = False) -> int:
        """Samples each rank reads this epoch from position ``start`` (the same for every rank)."""
        left = max(0, self.total - start)
        return left // world_size if drop_last else -(-left // world_size)

    def positions(
        self,
        rank: int,
        world_size: int,
        *,
        start: int = 0,
        drop_last: bool = False,
        worker: int = 0,
        workers: int = 1,
        worker_batch: int = 1,
    ) -> np.ndarray:
        """Global positions this rank's ``worker`` reads, from position ``start`` on.

        ``start`` is how far the job as a whole had got (what ``consumed``
        says). Position ``start + j`` goes to rank ``j % world_size``;
        positions past the end wrap round (padding).
        """
        if not 0 <= rank < world_size or not 0 <= worker < workers:
            raise InvalidArgument(f"rank {rank} of {world_size}, worker {worker} of {workers}")
        count = self.per_rank(world_size, start=start, drop_last=drop_last)
        mine = start + rank + world_size * np.arange(count, dtype=np.int64)
        turns = worker_turns(count, workers, worker_batch)
        picked: np.ndarray = mine[turns == worker] % max(1, self.total)
        return picked

    def _shuffled(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.permutation(n) if self.shuffle else np.arange(n)


def _triples(shard: int, rows: np.ndarray, group: int) -> np.ndarray:
    out = np.empty((len(rows), 3), dtype=np.int64)
    out[:, 0], out[:, 1], out[:, 2] = shard, rows, group
    return out


def worker_turns(count: int, workers: int, worker_batch: int) -> np.ndarray:
    """Which worker reads each of a rank's ``count`` samples: turns of ``worker_batch``."""
    turns: np.ndarray = (np.arange(count) // worker_batch) % workers
    return turns


def consumed(start: int, per_rank_read: int, world_size: int) -> int:
    """How far the job has got once every rank has read ``per_rank_read`` samples from ``start``."""
    return start + per_rank_read * world_size
