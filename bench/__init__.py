"""graben.bench: throughput of every door, beside its peers, in one run.

A workload is a function registered with ``@workload(name, summary)`` in its
door's module, ``graben/bench/_workloads/<door>.py``; it receives a
``Context`` and returns one ``Result`` per system it measured, each naming
the baseline its ratio is taken against. ``graben bench`` discovers, runs and reports them.
"""

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
