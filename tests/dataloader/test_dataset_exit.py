"""A program that leaves an iteration partly read exits cleanly: the iteration's cleanup
(its prefetch threads, its counts) runs at exit while Python is whole, not in the
interpreter's teardown, where it printed "Exception ignored ... AttributeError:
'NoneType' object has no attribute 'Empty'"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from graben.dataloader import write_dataset

PARTLY = """
import sys
from graben.dataloader import CachedDataset
ds = CachedDataset(sys.argv[1], cache_dir=sys.argv[2], seed=0, prefetch=3)
it = iter(ds)
print(next(it)["i"], next(it)["i"])
kept = [iter(ds), iter(ds)]  # one begun and left, one never begun
next(kept[0])
"""


@pytest.mark.parametrize("kind", ["local", "graben"])
def test_a_partly_read_iteration_exits_without_a_word(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if kind == "local":
        url = str(tmp_path / "ds")
    else:
        url = f"{request.getfixturevalue('cluster_url')}/exit/{tmp_path.name}"
    write_dataset(url, [{"i": i} for i in range(400)], rows_per_shard=20)
    for _ in range(3):
        ran = subprocess.run(
            [sys.executable, "-c", PARTLY, url, str(tmp_path / "cache")],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert ran.returncode == 0, ran.stderr
        assert ran.stderr == "", ran.stderr
        assert len(ran.stdout.split()) == 2
