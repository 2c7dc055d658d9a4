"""A local cluster whose processes a test can kill (``graben.store.local``'s, with the
tests' defaults); and what tests ask of any cluster: copies of a file's chunks, live
nodes, metrics."""

from __future__ import annotations

import contextlib
import os
import re
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from graben.store import Client, local
from graben.store.client import _loop
from graben.store.transport._requests import GetLayout, ListNodes


class LocalCluster(local.LocalCluster):
    """``graben.store.local``'s cluster with the tests' defaults: replication 3, a node
    dead after 10 s without a heartbeat, repair every 5 s, no scrub within a test, no
    rebalancing (copies stay where they were written) unless ``rebalance`` bytes/s."""

    def __init__(
        self,
        root: Path,
        nodes: int,
        *,
        replication: int = 3,
        timeout: float = 10.0,
        repair: float = 5.0,
        scrub: float = 3600.0,
        rebalance: int = 0,
        meta_args: tuple[str, ...] = (),
        node_args: tuple[str, ...] = (),
        **options: Any,
    ):
        super().__init__(
            root,
            nodes,
            replication=replication,
            heartbeat_timeout=timeout,
            meta_args=(
                *("--repair-interval", str(repair), "--rebalance-rate", str(rebalance)),
                *meta_args,
            ),
            node_args=("--scrub-interval", str(scrub), *node_args),
            **options,
        )

    def chunk_files(self, i: int) -> list[Path]:
        return sorted(p for p in (self.node_dir(i) / "chunks").glob("??/??/*") if p.is_file())


@contextlib.contextmanager
def three_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``graben cluster up`` with 3 data nodes on loopback, on the session's secret; its URL."""
    secret = Path(os.environ["GRABEN_SECRET_FILE"])
    with local.cluster_up(tmp_path_factory.mktemp("cluster"), nodes=3, secret_file=secret) as url:
        yield url


def copies(client: Client, path: str) -> list[int]:
    """Copies of each chunk of ``path`` on nodes the metadata service thinks alive."""
    layout = _loop.run(client.aio.meta.request(GetLayout(path)))
    live = {n.id for n in _loop.run(client.aio.meta.request(ListNodes())) if n.alive}
    return [len(set(layout.replicas[x.chunk.id]) & live) for x in layout.extents]


def alive(client: Client) -> int:
    """Data nodes the metadata service thinks alive."""
    return sum(n.alive for n in _loop.run(client.aio.meta.request(ListNodes())))


def eventually(check: Callable[[], bool], seconds: float = 30.0) -> float:
    """Seconds until ``check`` held (polled every 0.2 s); fails after ``seconds``."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < seconds, "did not happen in time"
        time.sleep(0.2)
    return time.monotonic() - started


def scrape(port: int) -> dict[str, float]:
    """``/metrics`` at 127.0.0.1:``port``: each sample line's value by its name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        assert reply.status == 200
        text = reply.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def sum_of(samples: dict[str, float], pattern: str) -> float:
    """The sum of the samples whose name and labels match ``pattern`` whole."""
    return sum(v for k, v in samples.items() if re.fullmatch(pattern, k))
