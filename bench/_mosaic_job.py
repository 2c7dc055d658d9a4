"""Mosaic Streaming's side of ``dataset-epoch``, run by the peer's own Python.

Mosaic Streaming needs a torch build that differs from the project's pin, so
it lives in its own virtual environment (``make peers``) and this script runs
there as a subprocess: it imports nothing of graben. It converts the bench's
local Parquet shards to Mosaic's MDS format (untimed), then times one
shuffled epoch of ``StreamingDataset`` reading them from local disk, and
prints ``{"samples": N, "seconds": S}``.

    python _mosaic_job.py PARQUET_DIR MDS_DIR
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path


def main(parquet: Path, mds: Path) -> None:
    import pyarrow.parquet as pq
    from streaming import MDSWriter, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    shutil.rmtree(mds, ignore_errors=True)
    with MDSWriter(out=str(mds), columns={"id": "int", "data": "bytes"}, size_limit=1 << 23) as out:
        for shard in sorted(parquet.glob("*.parquet")):
            for row in pq.read_table(shard).to_pylist():
                out.write(row)
    clean_stale_shared_memory()
    # batch_size only shapes its partition: 256 ran 4x faster here than 1.
    dataset = StreamingDataset(local=str(mds), shuffle=True, shuffle_seed=0, batch_size=256)
    start = time.perf_counter()
    samples = sum(1 for _ in dataset)
    seconds = time.perf_counter() - start
    print(json.dumps({"samples": samples, "seconds": seconds}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
