"""graben.checkpoint: torch.distributed.checkpoint storage on a graben store.

``GrabenWriter(url)`` / ``GrabenReader(url)`` are DCP's ``StorageWriter`` /
``StorageReader``: pass them to ``dcp.save``, ``dcp.async_save`` and
``dcp.load``. Saves are atomic (published by one rename), checksummed and
incremental (unchanged tensors are not uploaded again); loads read only the
bytes each rank needs. Files keep DCP's layout, so DCP's own tools read them.
"""

from ._manager import CheckpointInfo, CheckpointManager, Retention
from ._storage import GrabenReader, GrabenWriter

__all__ = ["CheckpointInfo", "CheckpointManager", "GrabenReader", "GrabenWriter", "Retention"]
