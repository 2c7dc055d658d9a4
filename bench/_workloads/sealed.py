"""Encryption at rest: durable writes and warm reads with chunk files sealed (AES-256-GCM)
beside the same without a key, same bytes, same run: an embedded store, and a 3-node
loopback cluster (RF=1) of each kind. Target (issue "Many teams on one cluster"): >= 0.8x
each."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from time import perf_counter
from typing import Any

from graben.store import connect
from graben.store.cli._local import local_cluster, make_secret_file

from .._context import Context
from .._kit import block_buffer, drain, environ, gbps, random_data
from .._registry import Result, workload

GBPS = "GB/s"
PLAIN, SEALED = "graben embedded", "graben embedded, encrypted at rest"


@workload("sealed", "embedded write and warm read: chunk files encrypted at rest vs not")
def sealed(ctx: Context) -> list[Result]:
    """One durable write and the median of 3 warm reads of each store, the unencrypted
    one first, then the encrypted one (and the other way round the next trial)."""
    data, buffer = ctx.fixture(random_data), ctx.fixture(block_buffer)
    key = ctx.scratch / "key"
    key.write_bytes(os.urandom(32).hex().encode())
    key.chmod(0o600)
    took: dict[str, tuple[float, float]] = {}
    with memoryview(data) as view, memoryview(buffer) as into:
        for system in (PLAIN, SEALED):
            root = ctx.scratch / system.replace(" ", "-").replace(",", "")
            env = {"GRABEN_ENCRYPTION_KEY_FILE": str(key)} if system == SEALED else {}
            with environ(env), connect(root) as store:
                write = _timed(lambda: store.put("/f", view[: ctx.size]))
                reads = []
                for turn in range(4):  # the first warms the page cache
                    with store.open("/f") as f, ctx.step(f"{system} read", ctx.size) as tick:
                        seconds = _timed(lambda: drain(f.readinto, into, tick))
                    if turn:
                        reads.append(seconds)
            shutil.rmtree(root)
            took[system] = (write, sorted(reads)[1])
    name = "sealed"
    cluster = _clusters(ctx, key, view_of=data, into=buffer)
    return [
        *cluster,
        Result(name, f"{PLAIN}: write", gbps(ctx.size, took[PLAIN][0]), GBPS, f"{PLAIN}: write"),
        Result(name, f"{SEALED}: write", gbps(ctx.size, took[SEALED][0]), GBPS, f"{PLAIN}: write"),
        Result(name, f"{PLAIN}: read", gbps(ctx.size, took[PLAIN][1]), GBPS, f"{PLAIN}: read"),
        Result(name, f"{SEALED}: read", gbps(ctx.size, took[SEALED][1]), GBPS, f"{PLAIN}: read"),
    ]


def _timed(work: Callable[[], object]) -> float:
    start = perf_counter()
    work()
    return perf_counter() - start


CLUSTER, CLUSTER_SEALED = "graben cluster RF=1", "graben cluster RF=1, encrypted at rest"


def _clusters(ctx: Context, key: Path, *, view_of: Any, into: Any) -> list[Result]:
    """The same write and reads through a 3-node cluster without a key, then with one."""
    took: dict[str, tuple[float, float]] = {}
    for system in (CLUSTER, CLUSTER_SEALED):
        root = ctx.scratch / system.replace(" ", "-").replace(",", "").replace("=", "")
        root.mkdir()
        secret = make_secret_file(root / "secret")
        sealed = ("--encryption-key-file", str(key)) if system == CLUSTER_SEALED else ()
        with (
            environ({"GRABEN_SECRET_FILE": str(secret)}),
            local_cluster(root, 3, secret, extra=sealed) as url,
            connect(url, replication=1) as client,
            memoryview(view_of) as view,
            memoryview(into) as dest,
        ):
            write = _timed(lambda: client.put("/f", view[: ctx.size]))
            reads = []
            for turn in range(4):
                with client.open("/f") as f, ctx.step(f"{system} read", ctx.size) as tick:
                    seconds = _timed(lambda: drain(f.readinto, dest, tick))
                if turn:
                    reads.append(seconds)
        took[system] = (write, sorted(reads)[1])
    name, unit = "sealed", GBPS
    return [
        Result(
            name, f"{CLUSTER}: write", gbps(ctx.size, took[CLUSTER][0]), unit, f"{CLUSTER}: write"
        ),
        Result(
            name,
            f"{CLUSTER_SEALED}: write",
            gbps(ctx.size, took[CLUSTER_SEALED][0]),
            unit,
            f"{CLUSTER}: write",
        ),
        Result(
            name, f"{CLUSTER}: read", gbps(ctx.size, took[CLUSTER][1]), unit, f"{CLUSTER}: read"
        ),
        Result(
            name,
            f"{CLUSTER_SEALED}: read",
            gbps(ctx.size, took[CLUSTER_SEALED][1]),
            unit,
            f"{CLUSTER}: read",
        ),
    ]
