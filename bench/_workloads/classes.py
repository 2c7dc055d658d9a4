"""Storage classes: ec:6+3 beside RF=3 on one 9-node cluster; the S3 tier beside RF=3.

One cluster of its own per trial (two of its nodes are SIGKILLed at the end):
the RF=3 write of the run's bytes is the baseline of the conversion (the
leader's background work, from ``graben class set`` until every chunk is a
stripe); the RF=3 warm read is the baseline of the stripe's reads, healthy
and with two nodes dead; and the bytes the nodes hold per byte stored, RF=3
beside ec:6+3. Targets (issue "Storage classes"): physical <= 1.55x, healthy
read >= 0.9x, two dead >= 0.5x, conversion >= 0.5x the RF=3 write.

``cluster-s3-tier`` gives a 3-node cluster an S3 tier on moto's server: a
file of class ``s3`` read cold (through the nodes from the bucket) and warm
(from the nodes' caches) beside the RF=3 warm read. Target: warm >= 0.9x.
"""

from __future__ import annotations

import mmap
import os
import signal
from time import sleep

from graben.store import Client, connect
from graben.store.cli._trees import physical
from graben.store.local import cluster_up, make_secret_file

from .._context import Context
from .._kit import block_buffer, drain, environ, gbps, random_data
from .._registry import Result, Skip, workload
from .faults import _server_pid
from .fsspec import _timed, aws_env, moto_s3

NODES = 9
CLASS = "ec:6+3"
GBPS = "GB/s"
WRITE = "graben RF=3 write"
READ = "graben RF=3 warm read"
HELD = "RF=3: bytes on disk per byte"
READS = 3


@workload("cluster-ec", f"{CLASS} on {NODES} nodes beside RF=3: conversion, reads, bytes held")
def cluster_ec(ctx: Context) -> list[Result]:
    """Conversion, reads (healthy and with two nodes SIGKILLed) and bytes on disk of an
    erasure-coded class, each beside RF=3 on the same cluster in the same trial."""
    if ctx.target is not None:
        raise Skip("--target: the bench kills no node of a deployed cluster")
    data, buffer = ctx.fixture(random_data), ctx.fixture(block_buffer)
    root = ctx.scratch / "ec"
    root.mkdir()
    secret = make_secret_file(root / "secret")
    with (
        environ({"GRABEN_SECRET_FILE": str(secret)}),
        cluster_up(root, NODES, secret) as url,
        connect(url) as client,
        memoryview(buffer) as into,
    ):
        write = _timed(lambda: client.put("/rf3/f", memoryview(data)[: ctx.size]))
        client.put("/ec/f", _other(data, ctx.size))
        client.set_class("/ec", CLASS)
        convert = _timed(lambda: _wait_striped(client, "/ec/f"))
        read = _median_read(ctx, client, "/rf3/f", into)
        healthy = _median_read(ctx, client, "/ec/f", into)
        held = {p: physical(client, p)[0] / ctx.size for p in ("/rf3", "/ec")}
        for node in (0, 1):
            os.kill(_server_pid(root / f"node{node}"), signal.SIGKILL)
        with connect(url) as fresh:  # knows nothing of the dead
            dead = _median_read(ctx, fresh, "/ec/f", into)
    name = "cluster-ec"
    return [
        Result(name, WRITE, gbps(ctx.size, write), GBPS, WRITE),
        Result(
            name, f"graben {CLASS} conversion (background)", gbps(ctx.size, convert), GBPS, WRITE
        ),
        Result(name, READ, gbps(ctx.size, read), GBPS, READ),
        Result(name, f"graben {CLASS} warm read", gbps(ctx.size, healthy), GBPS, READ),
        Result(name, f"graben {CLASS} read, 2 nodes SIGKILLed", gbps(ctx.size, dead), GBPS, READ),
        Result(name, HELD, held["/rf3"], "x", HELD),
        Result(name, f"{CLASS}: bytes on disk per byte", held["/ec"], "x", HELD),
    ]


def _other(data: mmap.mmap, size: int) -> bytes:
    """The run's bytes with each 4 KiB page changed: chunks the RF=3 file does not share."""
    view = bytearray(memoryview(data)[:size])
    view[::4096] = bytes(len(view[::4096]))
    view[1::4096] = b"\x01" * len(view[1::4096])
    return bytes(view)


def _wait_striped(client: Client, path: str) -> None:
    while True:
        state = client.storage_class(path)
        if state.chunks and state.converted == state.chunks:
            return
        sleep(0.02)


def _median_read(ctx: Context, client: Client, path: str, into: memoryview) -> float:
    """The median of ``READS`` sequential reads, after one to warm the nodes' caches."""
    _read(ctx, client, path, into)
    times = [_timed(lambda: _read(ctx, client, path, into)) for _ in range(READS)]
    return sorted(times)[len(times) // 2]


@workload("cluster-s3-tier", "class s3 on moto, read through the nodes: cold and warm vs RF=3")
def cluster_s3_tier(ctx: Context) -> list[Result]:
    """Reads of a file moved to the S3 tier, cold and then from the nodes' caches, beside
    the same bytes kept RF=3 on the same cluster."""
    if ctx.target is not None:
        raise Skip("--target: the bench sets no S3 tier on a deployed cluster")
    data, buffer, s3 = ctx.fixture(random_data), ctx.fixture(block_buffer), ctx.fixture(moto_s3)
    root = ctx.scratch / "tier"
    root.mkdir()
    secret = make_secret_file(root / "secret")
    tier = ("--s3-tier", "s3://bench/tier")
    with (
        environ({"GRABEN_SECRET_FILE": str(secret), **aws_env(dict(s3.storage_options))}),
        cluster_up(root, 3, secret, extra=tier) as url,
        connect(url) as client,
        memoryview(buffer) as into,
    ):
        client.put("/rf3/f", memoryview(data)[: ctx.size])
        client.put("/s3/f", _other(data, ctx.size))
        client.set_class("/s3", "s3")
        _wait_striped(client, "/s3/f")
        read = _median_read(ctx, client, "/rf3/f", into)
        cold = _timed(lambda: _read(ctx, client, "/s3/f", into))
        warm = _median_read(ctx, client, "/s3/f", into)
    name = "cluster-s3-tier"
    return [
        Result(name, READ, gbps(ctx.size, read), GBPS, READ),
        Result(name, "graben class s3, cold (from moto)", gbps(ctx.size, cold), GBPS, READ),
        Result(name, "graben class s3, warm (nodes' caches)", gbps(ctx.size, warm), GBPS, READ),
    ]


def _read(ctx: Context, client: Client, path: str, into: memoryview) -> None:
    with client.open(path) as f, ctx.step(f"read {path}", ctx.size) as tick:
        drain(f.readinto, into, tick)
