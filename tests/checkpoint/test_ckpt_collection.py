"""A training loop's checkpoints rotated out give their space back by themselves: 30 saves
with ``keep_last=3`` on a cluster leave its nodes holding what the last three need."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from cluster_kit import LocalCluster
from collect_kit import node_bytes, physical, seconds_until_within

from graben.checkpoint import CheckpointManager

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
GRACE = 2.0
ROUND = 0.5


def test_thirty_saves_keeping_three_hold_three_on_the_nodes(tmp_path: Path) -> None:
    cluster = LocalCluster(
        tmp_path, nodes=3, repair=ROUND, meta_args=("--collect-grace", str(GRACE))
    )
    try:
        with CheckpointManager(f"{cluster.url}/runs/a", keep_last=3) as manager:
            for step in range(30):
                model = {"w": torch.randn(1024, 1024), "step": step}  # 4 MiB, new each time
                manager.save(step, model)
            assert [c.step for c in manager.list()] == [27, 28, 29]
            last = {"w": torch.zeros(1024, 1024), "step": -1}
            assert manager.load_latest(last) == 29
        held = physical(cluster.url)
        assert 3 * 3 * 4 << 20 <= held < 3 * 3 * 5 << 20  # three saves, three copies each
        took = seconds_until_within(cluster, 3, cluster.url)
        assert took < GRACE + ROUND + 3.0, took
        time.sleep(GRACE + 2 * ROUND)  # the last rotation's too
        assert node_bytes(cluster, 3) <= held * 1.1
    finally:
        cluster.close()
