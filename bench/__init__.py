"""graben.bench: throughput of every door, beside its peers, in one run.

A workload is a function registered with ``@workload(name, summary)`` in its
door's module, ``graben/bench/_workloads/<door>.py``; it receives a
``Context`` and returns one ``Result`` per system it measured, each naming
the baseline its ratio is taken against. ``graben bench`` discovers, runs and reports them.
"""

from typing import TYPE_CHECKING

from graben.store import optional_door as _optional_door

if TYPE_CHECKING:
    from ._context import Context, Fixtures
    from ._kit import BLOCK, block_buffer, drop_cache, gbps, random_data, warm_cache
    from ._registry import Result, Skip, Workload, discover, select, workload
    from ._report import Rated, rate

__all__ = [
    "BLOCK",
    "Context",
    "Fixtures",
    "Rated",
    "Result",
    "Skip",
    "Workload",
    "block_buffer",
    "discover",
    "drop_cache",
    "gbps",
    "random_data",
    "rate",
    "select",
    "warm_cache",
    "workload",
]

# The workloads import the doors' extras and the peers' packages at their top.
__getattr__ = _optional_door(
    __name__,
    "bench",
    needs=("torch", "numpy", "pyarrow", "s3fs", "moto", "trustme"),
    names={
        "._context": (
            "Context",
            "Fixtures",
        ),
        "._kit": (
            "BLOCK",
            "block_buffer",
            "drop_cache",
            "gbps",
            "random_data",
            "warm_cache",
        ),
        "._registry": (
            "Result",
            "Skip",
            "Workload",
            "discover",
            "select",
            "workload",
        ),
        "._report": (
            "Rated",
            "rate",
        ),
    },
)
