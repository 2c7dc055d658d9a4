"""A CheckpointManager's memory tier on the status page (``graben meta serve --status``):
the page asks the job's memory agent what it holds and lists the job's root in the store."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from agent_kit import Agents
from cluster_kit import LocalCluster

from graben.checkpoint import CheckpointManager

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


@pytest.fixture
def agents() -> Iterator[Agents]:
    with Agents() as made:
        yield made


def test_a_jobs_steps_show_with_their_tiers(tmp_path: Path, agents: Agents) -> None:
    agent = agents.start("a")
    flags = ("--status-agents", agent)
    with LocalCluster(tmp_path, 1, status="127.0.0.1:0", meta_args=flags) as cluster:
        url = f"{cluster.url}/jobs/run-1"
        state = {"w": torch.arange(1000, dtype=torch.float32)}
        with CheckpointManager(url, tiers=("memory", "store"), agent=agent, store_every=2) as ckpt:
            ckpt.save(1, state)  # the first save goes on to the store too
            ckpt.save(2, state)  # the second stays in memory
            ckpt.wait()
        token = subprocess.run(
            [sys.executable, "-m", "graben.store.cli", "token", "cluster"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        page = f"http://{cluster.status_address}/status.json"
        request = urllib.request.Request(page, headers={"Authorization": f"Bearer {token}"})
        deadline = time.monotonic() + 10
        while True:
            with urllib.request.urlopen(request, timeout=10) as reply:
                jobs = {j["url"]: j["steps"] for j in json.loads(reply.read())["jobs"]}
            if url in jobs or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert {s["step"]: s["tiers"] for s in jobs[url]} == {1: "memory+store", 2: "memory"}
