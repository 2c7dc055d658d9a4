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

from typing import TYPE_CHECKING

from graben.store import optional_door as _optional_door

if TYPE_CHECKING:
    from ._manager import CheckpointManager, Retention
    from ._planner import GrabenLoadPlanner, GrabenSavePlanner
    from ._reader import GrabenReader
    from ._steps import CheckpointInfo
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

# Without its extra, importing the door fails naming it; with it, each name's
# module is imported when the name is first used (``graben --help`` stays quick).
__getattr__ = _optional_door(
    __name__,
    "checkpoint",
    needs=("torch", "numpy"),
    names={
        "._manager": ("CheckpointManager", "Retention"),
        "._steps": ("CheckpointInfo",),
        "._planner": ("GrabenLoadPlanner", "GrabenSavePlanner"),
        "._reader": ("GrabenReader",),
        "._writer": ("GrabenWriter",),
    },
)
