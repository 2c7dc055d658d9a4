"""graben.checkpoint: torch.distributed.checkpoint storage on a graben store.

``GrabenWriter(url)`` / ``GrabenReader(url)`` are DCP's ``StorageWriter`` /
``StorageReader``: pass them to ``dcp.save``, ``dcp.async_save`` and
``dcp.load``. Saves are atomic (published by one rename), checksummed and
incremental (unchanged tensors are not uploaded again); loads read only the
bytes each rank needs. Files keep DCP's layout, so DCP's own tools read them.

``GrabenSavePlanner`` / ``GrabenLoadPlanner`` (``planner=`` of the same
calls) keep planning flat as the world grows: plans cached across steps,
and each loading rank reads only the metadata of the ranks it needs.
"""

from ._manager import CheckpointInfo, CheckpointManager, Retention
from ._planner import GrabenLoadPlanner, GrabenSavePlanner
from ._reader import GrabenReader
from ._writer import GrabenWriter

__all__ = [
    "CheckpointInfo",
    "CheckpointManager",
    "GrabenLoadPlanner",
    "GrabenReader",
    "GrabenSavePlanner",
    "GrabenWriter",
    "Retention",
]
