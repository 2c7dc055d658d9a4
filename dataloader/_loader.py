"""``CachedLoader``: a DataLoader over a ``CachedDataset`` that knows where the loop is.

With DataLoader workers, each worker reads its copy of the dataset ahead of
the training loop (``prefetch_factor`` batches each), so no copy knows what
the loop has taken. The loader counts the batches it hands to the loop and
tells the dataset in the loop's process, whose ``state_dict`` then says how
far the job got, whatever the number of workers. It also makes the workers
take turns by ``batch_size`` samples, the way the DataLoader collects their
batches, so the rank reads its part of the global order in order, and
gives the workers a shared array to add their cache statistics to.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader

from graben.store import InvalidArgument

from ._dataset import STATS, CachedDataset


class CachedLoader(DataLoader[Any]):
    """``DataLoader(dataset, batch_size, **kwargs)`` with ``state_dict``/``load_state_dict``.

    ``persistent_workers`` are welcome: ``set_epoch`` and ``load_state_dict``
    reach them. Refuses ``in_order=False`` (batches would reach the loop out
    of the order counted).
    """

    def __init__(self, dataset: CachedDataset, batch_size: int = 1, **kwargs: Any) -> None:
        if kwargs.get("in_order") is False:
            raise InvalidArgument(
                "CachedLoader: batches must reach the loop in order (in_order=True)"
            )
        if not isinstance(dataset, CachedDataset):
            raise InvalidArgument(
                f"CachedLoader reads a CachedDataset, not {type(dataset).__name__}"
            )
        dataset.worker_batch = batch_size or 1  # None: no batching, a sample at a time
        super().__init__(dataset, batch_size=batch_size, **kwargs)
        self.cached = dataset
        if self.num_workers and dataset._tally is None:  # workers add their stats here
            context = self.multiprocessing_context or multiprocessing.get_context()
            dataset._tally = context.Array("d", len(STATS))

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        dataset, size = self.cached, self.batch_size or 1
        total = len(dataset)
        dataset.yielded = 0
        for taken, batch in enumerate(super().__iter__(), start=1):
            dataset.yielded = min(taken * size, total)  # what the loop has, not the workers
            yield batch

    def state_dict(self) -> dict[str, int]:
        """Where the job is: the epoch and how far through it every rank's loop has got."""
        return self.cached.state_dict(samples_seen=self.cached.yielded)

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Carry on from ``state`` (saved with any world size and number of workers)."""
        self.cached.load_state_dict(state)
