"""TLS workloads: RF=1 write and warm read through a cluster speaking TLS on every
connection, beside the same through the plaintext cluster of the run.

The TLS cluster is a second ``graben cluster up`` (3 nodes, loopback) whose
certificates come from a CA made for the run (``trustme``, in the bench and
dev extras); both clusters share one secret. Each trial measures both, the
order alternating by trial, so neither always runs on a warmer machine.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from time import perf_counter

from graben.store import TLS, Client, Unavailable, connect
from graben.store.local import cluster_up

from .._context import Context
from .._kit import block_buffer, drain, gbps, random_data
from .._registry import Result, Skip, workload
from .cluster import GBPS, local_cluster

PLAIN = "graben cluster RF=1, plaintext"
OVER_TLS = "graben cluster RF=1, TLS"


@contextmanager
def tls_cluster(ctx: Context) -> Iterator[tuple[str, TLS]]:
    """A fixture: a 3-node cluster for the whole run, TLS on every connection; yields its
    URL and what its clients need (the run's CA)."""
    if ctx.target is not None:
        raise Skip("--target: no cluster of the bench's own is started")
    ctx.fixture(local_cluster)  # sets $GRABEN_SECRET_FILE for the run: both share it
    try:
        import trustme
    except ImportError:
        raise Skip("needs trustme to make the run's certificates (pip install trustme)") from None
    root = ctx.shared / "tls-cluster"
    root.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")  # what the local cluster listens on and advertises
    ca.cert_pem.write_to_path(str(root / "ca.pem"))
    cert.cert_chain_pems[0].write_to_path(str(root / "server.pem"))
    cert.private_key_pem.write_to_path(str(root / "server.key"))
    flags = (
        *("--tls-cert", str(root / "server.pem"), "--tls-key", str(root / "server.key")),
        *("--tls-ca", str(root / "ca.pem")),
    )
    secret = Path(os.environ["GRABEN_SECRET_FILE"])
    try:
        with cluster_up(root / "data", 3, secret_file=secret, extra=flags) as url:
            yield url, TLS(ca=root / "ca.pem")
    except Unavailable as exc:
        raise Skip(str(exc)) from None


@contextmanager
def _both(ctx: Context) -> Iterator[list[tuple[str, Client]]]:
    """A client of each cluster, labelled, in this trial's order."""
    url = ctx.fixture(local_cluster)
    tls_url, tls = ctx.fixture(tls_cluster)
    with connect(url, tls=None) as plain, connect(tls_url, tls=tls) as secure:
        pair = [(PLAIN, plain), (OVER_TLS, secure)]
        yield pair if ctx.trial % 2 == 0 else pair[::-1]


def _write(ctx: Context, client: Client, data: mmap.mmap, label: str) -> float:
    with memoryview(data) as view, ctx.step(f"write, {label}", ctx.size) as tick:
        start = perf_counter()
        client.put("/bench/tls-write", view[: ctx.size], replication=1)
        seconds = perf_counter() - start
        tick(ctx.size)
    client.rm("/bench/tls-write")  # a live copy would let the next trial skip every chunk
    return seconds


@workload("cluster-tls-write", "RF=1 durable write to a 3-node cluster over TLS vs plaintext")
def cluster_tls_write(ctx: Context) -> list[Result]:
    """The same bytes written through each cluster."""
    data = ctx.fixture(random_data)
    with _both(ctx) as clients:
        seconds = {label: _write(ctx, client, data, label) for label, client in clients}
    name = "cluster-tls-write"
    return [Result(name, s, gbps(ctx.size, seconds[s]), GBPS, PLAIN) for s in (PLAIN, OVER_TLS)]


def _warm_read(
    ctx: Context, client: Client, data: mmap.mmap, view: memoryview, label: str
) -> float:
    client.put("/bench/tls-read", memoryview(data)[: ctx.size], replication=1)
    for _ in range(2):  # the second pass is the warm one
        with client.open("/bench/tls-read") as f, ctx.step(f"read, {label}", ctx.size) as tick:
            start = perf_counter()
            drain(f.readinto, view, tick)
            seconds = perf_counter() - start
    client.rm("/bench/tls-read")
    return seconds


@workload("cluster-tls-read", "warm sequential read from a 3-node cluster over TLS vs plaintext")
def cluster_tls_read(ctx: Context) -> list[Result]:
    """The same file read back through each cluster, page cache warm on the nodes."""
    data, buffer = ctx.fixture(random_data), ctx.fixture(block_buffer)
    with _both(ctx) as clients, memoryview(buffer) as view:
        seconds = {label: _warm_read(ctx, client, data, view, label) for label, client in clients}
    name = "cluster-tls-read"
    return [Result(name, s, gbps(ctx.size, seconds[s]), GBPS, PLAIN) for s in (PLAIN, OVER_TLS)]
