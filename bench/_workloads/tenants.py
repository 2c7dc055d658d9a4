"""Tenants: what a tenant's token and its quota cost a writer. 4 KiB files from 64
clients and one large put, with a tenant's token writing under its quota (every request
checked against the token's prefix, every commit moving the quota's usage, every chunk
checked against it before it is sent), beside the cluster's own token writing where no
quota is, on the same cluster in the same run."""

from __future__ import annotations

import asyncio
import os
import uuid

from graben.store import connect

from .._context import Context
from .._kit import gbps, random_data
from .._registry import Result, workload
from .cluster import SMALL, _small_graben, local_cluster
from .fsspec import _timed

OWN, TENANT = "graben cluster, its own token", "graben cluster, a tenant's token and quota"


@workload("tenants", "4 KiB files/s and a large put: a tenant's token and quota vs none")
def tenants(ctx: Context) -> list[Result]:
    """The same writes with the cluster's token where no quota is and with a tenant's under
    its quota, in the order own, tenant, tenant, own (a fresh cluster's first writes are
    slower), each figure the mean of its two."""
    url = ctx.fixture(local_cluster)
    data = ctx.fixture(random_data)
    payloads = [os.urandom(SMALL) for _ in range(1000 if ctx.quick else 4000)]
    name = f"bench-{uuid.uuid4().hex[:8]}"
    root = f"/.graben-bench-{name}"
    times: dict[tuple[str, str], list[float]] = {}
    with connect(url) as operator:
        operator.add_tenant(name, root, max_bytes=1 << 50, max_files=10**9)
        token = operator.issue_token(name, ttl_s=3600)
        try:
            for n, key in enumerate((None, token, token, None)):
                system = TENANT if key else OWN
                where = f"{root}/run{n}" if key else f"{root}-own/run{n}"
                small = asyncio.run(_small_graben([url], payloads, ctx, token=key, root=where))
                big = f"{where}/big"
                with connect(url, token=key) as client, memoryview(data) as view:
                    put = _timed(lambda: client.put(big, view[: ctx.size]))  # noqa: B023
                    client.rm(big)
                times.setdefault((system, "small"), []).append(small)
                times.setdefault((system, "put"), []).append(put)
        finally:
            operator.revoke_tokens(tenant=name)
            operator.rm(root, recursive=True)
            operator.rm(f"{root}-own", recursive=True)
    rows = []
    for system in (OWN, TENANT):
        small, put = (sum(times[system, w]) / 2 for w in ("small", "put"))
        rows += [
            Result(
                "tenants",
                f"{system}: 4 KiB files",
                len(payloads) / small,
                "files/s",
                f"{OWN}: 4 KiB files",
            ),
            Result("tenants", f"{system}: put", gbps(ctx.size, put), "GB/s", f"{OWN}: put"),
        ]
    return rows
