"""The README's pandas/pyarrow example, run in a fresh interpreter by test_fsspec_exit.py.

``argv[1]``: a directory URL (``graben:///d`` or ``graben://host:port/d``);
``argv[2]``: ``write`` to make the files, ``read`` to read them and exit at once
(the exit right after ``to_table()`` is what used to abort).
"""

from __future__ import annotations

import sys

import fsspec
import pandas as pd
import pyarrow.dataset as ds

base, step = sys.argv[1], sys.argv[2]
if step == "write":
    pd.DataFrame({"a": range(1000)}).to_parquet(f"{base}/metrics.parquet")
    for k in range(4):
        part = pd.DataFrame({"a": range(k * 20_000, (k + 1) * 20_000), "s": ["x" * 20] * 20_000})
        part.to_parquet(f"{base}/web/p{k}.parquet", row_group_size=5_000)
    with fsspec.open(f"{base}/logs/run.txt.gz", "wt", compression="gzip") as f:
        f.write("...")
else:
    assert len(pd.read_parquet(f"{base}/metrics.parquet")) == 1000
    fs, root = fsspec.core.url_to_fs(f"{base}/web")
    assert ds.dataset(root, filesystem=fs, format="parquet").to_table().num_rows == 80_000
print("ok")
