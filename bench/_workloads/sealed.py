"""Encryption at rest: durable writes and warm reads with chunk files sealed (AES-256-GCM)
beside the same without a key, same bytes, same run: an embedded store, and a 3-node
loopback cluster (RF=1) of each kind. Target (issue "Many teams on one cluster"): >= 0.8x
each."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from graben.store import Client, connect
from graben.store.local import cluster_up, make_secret_file

from .._context import Context
from .._kit import block_buffer, environ, gbps, random_data
from .._registry import Result, workload
from .classes import _median_read
from .fsspec import _timed

GBPS = "GB/s"
EMBEDDED, CLUSTER = "graben embedded", "graben cluster RF=1"
SEALED = ", encrypted at rest"


@workload("sealed", "embedded and cluster write and warm read: encrypted at rest vs not")
def sealed(ctx: Context) -> list[Result]:
    """For each kind of store, one durable write and the median of 3 warm reads without a
    key, then the same with one."""
    data, buffer = ctx.fixture(random_data), ctx.fixture(block_buffer)
    key = ctx.scratch / "key"
    key.write_bytes(os.urandom(32).hex().encode())
    key.chmod(0o600)
    rows: list[Result] = []
    with memoryview(data) as view, memoryview(buffer) as into:
        for kind, store in ((CLUSTER, _cluster), (EMBEDDED, _embedded)):
            for system in (kind, kind + SEALED):
                with store(ctx, system, key if system.endswith(SEALED) else None) as client:
                    os.sync()  # the last store's writeback is not this one's to wait for
                    write = _timed(lambda: client.put("/f", view[: ctx.size]))
                    read = _median_read(ctx, client, "/f", into)
                for what, seconds in (("write", write), ("read", read)):
                    baseline = f"{kind}: {what}"
                    rows.append(
                        Result(
                            "sealed", f"{system}: {what}", gbps(ctx.size, seconds), GBPS, baseline
                        )
                    )
    return rows


@contextlib.contextmanager
def _embedded(ctx: Context, system: str, key: Path | None) -> Iterator[Client]:
    env = {} if key is None else {"GRABEN_ENCRYPTION_KEY_FILE": str(key)}
    with environ(env), connect(ctx.scratch / _dir(system)) as client:
        yield client


@contextlib.contextmanager
def _cluster(ctx: Context, system: str, key: Path | None) -> Iterator[Client]:
    root = ctx.scratch / _dir(system)
    root.mkdir()
    secret = make_secret_file(root / "secret")
    sealed = () if key is None else ("--encryption-key-file", str(key))
    with (
        environ({"GRABEN_SECRET_FILE": str(secret)}),
        cluster_up(root, 3, secret, extra=sealed) as url,
        connect(url, replication=1) as client,
    ):
        yield client


def _dir(system: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in system)
