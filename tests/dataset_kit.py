"""The dataset most dataset tests read: ``N`` rows ``{"id": i}`` in small shards."""

from __future__ import annotations

N = 203
"""Samples: not a multiple of any world size or batch size, so padding and
short batches happen."""


def write_rows(url: str) -> str:
    """Write the ``N`` rows at ``url``: 11 Parquet shards of 20 rows, groups of 7."""
    import pyarrow as pa

    from graben.dataloader import write_dataset

    write_dataset(url, pa.table({"id": list(range(N))}), rows_per_shard=20, rows_per_group=7)
    return url
