"""Hundreds of ranks save one checkpoint to the cluster at once and load it back.

Each rank has a client and connections of its own and goes through GrabenWriter's
and GrabenReader's calls as ``dcp.save``/``dcp.load`` make them
(``graben.bench._ranks``); the collectives are pipes to the coordinator. ``make
test`` runs 256 ranks in 4 processes; 1,024 take a minute (``pytest -m huge``;
``graben bench ckpt-ranks`` times them).
"""

from __future__ import annotations

import posixpath

import pytest
import torch
import torch.distributed.checkpoint as dcp

from graben.bench._ranks import Storage, save_and_load, shard
from graben.checkpoint import GrabenReader
from graben.store import connect

# The published checkpoint is read back in this one process: what DCP warns about.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def _saves_and_loads_every_byte(cluster_url: str, ranks: int) -> None:
    path = f"/ranks-{ranks}/step-1"
    outcome = save_and_load(Storage(cluster_url, path), ranks, 4, seed=ranks)
    print(
        f"{ranks} ranks: published {outcome.publish_s:.2f} s after the first byte, "
        f"loaded in {outcome.load_s:.2f} s; connections held {outcome.connections}"
    )
    # Every rank held a connection to the metadata service and, with three copies of
    # every chunk on three nodes, to every data node.
    assert len(outcome.connections) == 4
    assert all(held >= ranks for held in outcome.connections.values()), outcome.connections

    # The published checkpoint, read whole by one process as a user would: every
    # rank's tensor, every byte, and no staging directory left beside it.
    state = {f"shard.{r}": torch.zeros_like(shard(r, outcome.seed)) for r in range(ranks)}
    dcp.load(state, storage_reader=GrabenReader(cluster_url + path), no_dist=True)
    for r in range(ranks):
        assert torch.equal(state[f"shard.{r}"], shard(r, outcome.seed)), r
    with connect(cluster_url) as client:
        parent = posixpath.dirname(path)
        assert sorted(e.path for e in client.ls(parent)) == [path, f"{path}-warmup"]
        client.rm(parent, recursive=True)


@pytest.mark.slow
def test_256_ranks_save_one_checkpoint_at_once_and_load_every_byte(cluster_url: str) -> None:
    _saves_and_loads_every_byte(cluster_url, 256)


@pytest.mark.huge
def test_1024_ranks_save_one_checkpoint_at_once_and_load_every_byte(cluster_url: str) -> None:
    _saves_and_loads_every_byte(cluster_url, 1024)
