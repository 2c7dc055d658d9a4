"""``CachedDataset``: a torch ``IterableDataset`` over a sharded dataset at any URL.

Start-up reads the manifest, one object. Each rank and DataLoader worker
reads its positions of the epoch's order (``_order``) one group at a time
(a Parquet row group, a run of records) from shards mapped from the node
cache (``_cache``), and decodes only the rows it takes. Background threads
fill the cache with the next ``prefetch`` shards the rank will need, each
shard by one of the rank's workers, so a rank has at most ``prefetch`` fills
in flight whatever its number of workers; a fill streams through one
``PIECE`` of memory into the cache, and the shards' bytes are the page
cache's, shared by every worker. ``state_dict`` says how far the job has
got; ``load_state_dict`` carries on from there, on any world size.

Both follow torchdata's Stateful protocol, so ``StatefulDataLoader`` saves
each worker's own state beside the batches the loop took and gives it back
to the same worker on resume. What the main process says about where an
iteration starts (``set_epoch``, ``load_state_dict``) reaches workers through
shared memory, so persistent workers follow it too.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import multiprocessing.context
import multiprocessing.sharedctypes
import os
import time
import weakref
from collections.abc import Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from graben.store import InvalidArgument

from ._order import Plan, worker_turns
from ._shards import Sample, ShardSource

STATS = ("cache_hits", "cache_fills", "bytes_fetched", "refetched", "seconds_waited")
"""What ``CachedDataset.stats`` counts."""
_UNDER_WAY: weakref.WeakSet[Generator[Sample, None, None]] = weakref.WeakSet()
"""Iterations begun and not finished: closed at exit, while Python is whole."""


@atexit.register
def _close_iterations() -> None:
    """Finish iterations a program left partly read (their prefetch threads stopped, their
    counts published) before the interpreter's teardown would: by then the modules their
    cleanup uses may be gone ("'NoneType' object has no attribute 'Empty'")."""
    for iteration in list(_UNDER_WAY):
        with contextlib.suppress(ValueError):  # being run by another thread: it finishes it
            iteration.close()


class CachedDataset(ShardSource, IterableDataset[Sample]):
    """Samples of the dataset at ``url``, each once per epoch across ranks and workers.

    ``rank``/``world_size`` default to ``torch.distributed``'s (else 0 and 1).
    ``drop_last`` cuts the epoch to a multiple of the world size instead of
    padding it by wrapping round. ``worker_batch`` is the DataLoader's batch
    size (workers take turns by that many samples, so a rank sees its order).
    ``cache_dir``, ``cache_limit`` and ``storage_options`` are
    ``ShardSource``'s: the node cache, and fsspec's options for ``url``.
    """

    def __init__(
        self,
        url: str,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        prefetch: int = 2,
        worker_batch: int = 1,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        ShardSource.__init__(
            self,
            url,
            cache_dir=cache_dir,
            cache_limit=cache_limit,
            storage_options=storage_options,
        )
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.rank, self.world_size = _rank_and_world(rank, world_size)
        self.prefetch, self.worker_batch = prefetch, worker_batch
        self.epoch = 0
        self.start = 0
        """Position of the epoch the job had reached when this iteration began."""
        self.yielded = 0
        """Samples this process yielded since ``start`` (with no workers: the rank's)."""
        self.waited = 0.0
        """Seconds spent waiting for shards."""
        self._tally: Any = None  # a CachedLoader's shared array: its workers add their stats
        self._published = [0.0] * len(STATS)
        self._shared = _Shared(self.epoch, self.start)
        self._loaded: dict[str, int] | None = None  # a worker's state for its next iteration

    # -- torch ----------------------------------------------------------------------

    def __len__(self) -> int:
        """Samples this rank reads in the current epoch from where it is."""
        return self._plan().per_rank(self.world_size, start=self.start, drop_last=self.drop_last)

    def __iter__(self) -> Iterator[Sample]:
        # Runs when the DataLoader makes its fetcher, before the first sample:
        # ``state_dict`` from then on is this iteration's.
        info = get_worker_info()
        if info is None:
            worker, workers, skip = 0, 1, 0
            self._shared.workers_read = 0
        else:
            worker, workers = info.id, info.num_workers
            self.epoch, self.start, skip = self._worker_start()
            self._loaded = None
            self._shared.workers_read = 1
        self.yielded = skip  # counted from ``start``: with workers, this worker's turns
        iteration = self._iterate(worker, workers, skip)
        _UNDER_WAY.add(iteration)
        return iteration

    def _iterate(self, worker: int, workers: int, skip: int) -> Generator[Sample, None, None]:
        order = self._plan().global_order()
        picked = order[self._positions(worker, workers)[skip:]]
        rank_shards = _stretches(order[self._positions(0, 1), 0])
        self._node_cache()  # made here, not raced for by the prefetch threads
        self._fetch_source()
        prefetch = _Prefetch(self, rank_shards, worker, workers)
        try:
            yield from self._samples(picked, prefetch)
        finally:
            prefetch.close()
            self._publish()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its beginning (its order differs from every other's)."""
        self.epoch, self.start, self.yielded = epoch, 0, 0
        self._shared.set(epoch, 0)

    def state_dict(self, samples_seen: int | None = None) -> dict[str, int]:
        """Where the job is.

        In the main process: the epoch and ``position``, how far the whole job
        has got, which loads on any world size. ``samples_seen`` is what this
        rank consumed this epoch (default: what this process yielded); once
        DataLoader workers have read the dataset, what the main process
        yielded means nothing, so without ``samples_seen`` this raises
        (``CachedLoader`` and ``StatefulDataLoader`` know what the loop took).

        In a DataLoader worker (where ``StatefulDataLoader`` asks): this
        worker's own progress, which loads into the same worker of a loader
        with the same world size and number of workers.
        """
        info = get_worker_info()
        if info is not None:
            epoch, start, yielded = self.epoch, self.start, self.yielded
            if self._loaded is not None:  # loaded, its iteration not begun
                epoch, start, yielded = self._worker_start()
            return {
                "epoch": epoch,
                "seed": self.seed,
                "start": start,
                "world_size": self.world_size,
                "worker": info.id,
                "workers": info.num_workers,
                "worker_batch": self.worker_batch,
                "yielded": yielded,
            }
        if samples_seen is None and self._shared.workers_read:
            raise InvalidArgument(
                "CachedDataset.state_dict(): DataLoader workers read this dataset, so the main"
                " process cannot tell how far the loop got; ask the loader (CachedLoader or"
                " torchdata's StatefulDataLoader) or pass samples_seen="
            )
        seen = self.yielded if samples_seen is None else samples_seen
        return {
            "epoch": self.epoch,
            "position": self.start + seen * self.world_size,
            "seed": self.seed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Carry on from ``state``.

        ``state`` is what ``state_dict`` or ``CachedLoader.state_dict`` returned
        (any world size), or a whole ``StatefulDataLoader.state_dict()``: to
        resume on another world size or number of workers, load the old
        loader's state here and iterate a new ``StatefulDataLoader`` without
        its own ``load_state_dict``.
        """
        if get_worker_info() is not None:  # StatefulDataLoader, in a worker: this worker's own
            self._loaded = self._worker_state(state)
            return
        if "worker" in state:
            raise InvalidArgument(
                "this is one DataLoader worker's state; load the loader's whole state_dict()"
            )
        state = self._global_state(state)
        self.epoch, self.start, self.yielded = state["epoch"], state["position"], 0
        self._shared.set(self.epoch, self.start)

    @property
    def stats(self) -> dict[str, float]:
        """Cache hits and fills, bytes fetched, shards refetched, seconds waited for shards.

        This process's, and with a ``CachedLoader`` its workers' as well.
        """
        counts = self._counts()
        if self._tally is not None and get_worker_info() is None:
            counts = [mine + theirs for mine, theirs in zip(counts, self._tally[:], strict=True)]
        return dict(zip(STATS, counts, strict=True))

    # -- reading --------------------------------------------------------------------

    def _plan(self, epoch: int | None = None) -> Plan:
        groups = [s.group_sizes() for s in self.manifest.shards]
        return Plan(groups, self.seed, self.epoch if epoch is None else epoch, self.shuffle)

    # -- where an iteration starts --------------------------------------------------

    def _worker_start(self) -> tuple[int, int, int]:
        """A worker's next iteration: its epoch, start, and how many of its turns are done."""
        if self._loaded is not None:
            return self._loaded["epoch"], self._loaded["start"], self._loaded["yielded"]
        return self._shared.epoch, self._shared.start, 0  # what the main process said last

    def _check_seed(self, state: dict[str, Any]) -> None:
        if state.get("seed", self.seed) != self.seed:
            raise InvalidArgument(
                f"state is for seed {state['seed']}, this dataset has {self.seed}"
            )

    def _worker_state(self, state: dict[str, Any]) -> dict[str, int]:
        """``state`` as this worker's next iteration, if it can be this worker's."""
        self._check_seed(state)
        info = get_worker_info()
        assert info is not None
        if "worker" not in state:
            state = self._global_state(state)
            return {"epoch": state["epoch"], "start": state["position"], "yielded": 0}
        saved = (state["world_size"], state["workers"], state["worker_batch"], state["worker"])
        here = (self.world_size, info.num_workers, self.worker_batch, info.id)
        if saved != here:
            raise InvalidArgument(
                f"this loader state was saved with world size {saved[0]}, {saved[1]} workers and"
                f" worker_batch {saved[2]}; here: {here[0]}, {here[1]} and {here[2]}. To resume on"
                " another layout, pass the old loader's state_dict() to"
                " CachedDataset.load_state_dict and iterate a new StatefulDataLoader"
            )
        return {"epoch": state["epoch"], "start": state["start"], "yielded": state["yielded"]}

    def _global_state(self, state: dict[str, Any]) -> dict[str, int]:
        """``state`` (ours, or a whole ``StatefulDataLoader`` state) as epoch and position."""
        if "_snapshot" in state:  # StatefulDataLoader with workers
            snapshots = state["_snapshot"].get("_worker_snapshots", {}).values()
            workers = [w.get("dataset_state") for w in snapshots]
            if not workers or any(w is None for w in workers):
                raise InvalidArgument("this StatefulDataLoader state holds no CachedDataset state")
            return self._merged(workers, steps=state.get("_steps_since_snapshot", 0))
        if "dataset_state" in state:  # StatefulDataLoader without workers
            if state["dataset_state"] is None:
                raise InvalidArgument("this StatefulDataLoader state holds no CachedDataset state")
            return self._global_state(state["dataset_state"])
        if "position" not in state or "epoch" not in state:
            raise InvalidArgument(f"not a CachedDataset state: keys {sorted(state)}")
        self._check_seed(state)
        return {"epoch": int(state["epoch"]), "position": int(state["position"]), "seed": self.seed}

    def _merged(self, workers: list[dict[str, int]], steps: int) -> dict[str, int]:
        """How far a rank whose loader had these workers got, as a position of the epoch.

        Exact when the samples the workers read are the first ones of the
        rank's order, as they are when ``worker_batch`` is the batch size.
        """
        first = workers[0]
        for state in workers:
            self._check_seed(state)
            if any(state[k] != first[k] for k in ("epoch", "start", "world_size", "workers")):
                raise InvalidArgument("the workers' states are of different iterations")
        world, batch = first["world_size"], first["worker_batch"]
        plan = self._plan(first["epoch"])
        count = plan.per_rank(world, start=first["start"], drop_last=self.drop_last)
        turns = worker_turns(count, first["workers"], batch)
        read = np.zeros(count, dtype=bool)
        for state in workers:
            read[np.flatnonzero(turns == state["worker"])[: state["yielded"]]] = True
        done = int(read.sum())
        if not read[:done].all():
            raise InvalidArgument(
                "the workers had read samples out of the rank's order, so no position says"
                " where the job was: give CachedDataset worker_batch= the loader's batch_size"
            )
        done = min(count, done + steps * batch)  # batches taken since the workers' snapshots
        position = first["start"] + done * world
        return {"epoch": first["epoch"], "position": position, "seed": self.seed}

    def _positions(self, worker: int, workers: int) -> np.ndarray:
        """The global positions ``worker`` of ``workers`` reads for this rank."""
        return self._plan().positions(
            self.rank,
            self.world_size,
            start=self.start,
            drop_last=self.drop_last,
            worker=worker,
            workers=workers,
            worker_batch=self.worker_batch,
        )

    def _samples(self, picked: np.ndarray, prefetch: _Prefetch) -> Iterator[Sample]:
        shard_of, reader = -1, None
        for shard, group, lo, hi in _runs(picked):
            if shard != shard_of:
                prefetch.reached(shard)
                reader = None  # unmapped before the next is mapped
                started = time.perf_counter()
                reader = self._reader(shard)
                self.waited += time.perf_counter() - started
                shard_of = shard
                self._publish()
            assert reader is not None
            for sample in reader.samples(group, picked[lo:hi, 1]):
                self.yielded += 1
                yield sample

    def _counts(self) -> list[float]:
        cache = self._node_cache().stats
        return [cache.hits, cache.fills, cache.bytes_fetched, cache.refetched, self.waited]

    def _publish(self) -> None:
        """Add what this worker did since it last said to the loader's tally."""
        if self._tally is None or get_worker_info() is None:
            return
        now = self._counts()
        with self._tally.get_lock():
            for i, (value, said) in enumerate(zip(now, self._published, strict=True)):
                self._tally[i] += value - said
        self._published = now

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        if multiprocessing.context.get_spawning_popen() is None:
            state["_tally"] = None  # shared memory goes only to processes being started
            state["_shared"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if state["_shared"] is None:  # a copy, not a worker: it says for itself where it starts
            state["_shared"] = _Shared(state["epoch"], state["start"])
        self.__dict__.update(state)


class _Shared:
    """Where the main process says the next iteration starts, in memory its workers share.

    Forked workers inherit it and spawned ones receive it as they start; a
    persistent worker reads it at each new iteration. It also records that a
    worker has read the dataset, which makes the main process's own count
    meaningless.
    """

    def __init__(self, epoch: int, start: int) -> None:
        self.values = multiprocessing.sharedctypes.RawArray("q", 3)
        self.set(epoch, start)

    def set(self, epoch: int, start: int) -> None:
        self.values[0], self.values[1], self.values[2] = epoch, start, 0

    @property
    def epoch(self) -> int:
        return int(self.values[0])

    @property
    def start(self) -> int:
        return int(self.values[1])

    @property
    def workers_read(self) -> int:
        return int(self.values[2])

    @workers_read.setter
    def workers_read(self, value: int) -> None:
        self.values[2] = value


def _rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is not None and world_size is not None:
        return rank, world_size
    if dist.is_available() and dist.is_initialized():
        return (
            dist.get_rank() if rank is None else rank,
            dist.get_world_size() if world_size is None else world_size,
        )
    return rank or 0, world_size or 1


def _stretches(shards: np.ndarray) -> list[int]:
    """The shards in order, each stretch of one shard once."""
    if not len(shards):
        return []
    starts = np.flatnonzero(np.diff(shards, prepend=shards[0] - 1))
    return [int(s) for s in shards[starts]]


def _runs(picked: np.ndarray) -> Iterator[tuple[int, int, int, int]]:
    """``(shard, group, start, end)`` for each stretch of ``picked`` in one group."""
    if not len(picked):
        return
    units = picked[:, 0] * (1 << 32) + picked[:, 2]
    bounds = [*np.flatnonzero(np.diff(units, prepend=units[0] - 1)).tolist(), len(picked)]
    for lo, hi in itertools.pairwise(bounds):
        yield int(picked[lo, 0]), int(picked[lo, 2]), lo, hi


class _Prefetch:
    """Warms the rank's next ``prefetch`` shards, the ones this worker is due to."""

    def __init__(self, dataset: CachedDataset, shards: list[int], worker: int, workers: int):
        self.dataset, self.shards, self.worker, self.workers = dataset, shards, worker, workers
        self.at = 0
        self.started: set[int] = set()
        threads = max(1, -(-dataset.prefetch // workers))
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="graben-prefetch")

    def reached(self, shard: int) -> None:
        """The worker is at ``shard``: warm the ones after it in the rank's order."""
        while self.at < len(self.shards) and self.shards[self.at] != shard:
            self.at += 1
        ahead = range(self.at + 1, min(len(self.shards), self.at + 1 + self.dataset.prefetch))
        for index in ahead:
            upcoming = self.shards[index]
            if index % self.workers == self.worker and upcoming not in self.started:
                self.started.add(upcoming)
                self.pool.submit(self.dataset._warm, upcoming)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
