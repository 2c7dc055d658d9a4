"""One rank of a 2-rank gloo job saving or loading a DCP checkpoint through fsspec.

``python dcp_ranks.py save|load URL RANK WORLD PORT``: the state dict is a
tensor sharded by rank plus a replicated one, the same on every run, so the
loading ranks can check every value.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.checkpoint._storage_utils import _storage_setup

STOCK = {"save": FsspecWriter, "load": FsspecReader}


def expected(rank: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1234 + rank)
    return {
        f"shard{rank}": torch.randn(256, 64, generator=gen),
        "shared": torch.arange(1000, dtype=torch.float32),
    }


def main() -> None:
    action, url, rank, world, port = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        # checkpoint_id alone, as users write it: DCP must pick its own fsspec
        # writer and reader for a graben:// URL.
        if not isinstance(_storage_setup(None, url, reader=action == "load"), STOCK[action]):
            raise SystemExit(f"DCP did not pick its fsspec storage for {url}")
        if action == "save":
            dcp.save(expected(rank), checkpoint_id=url)
        else:
            state = {k: torch.zeros_like(v) for k, v in expected(rank).items()}
            dcp.load(state, checkpoint_id=url)
            for key, value in expected(rank).items():
                if not torch.equal(state[key], value):
                    raise SystemExit(f"rank {rank}: {key} differs after load")
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
