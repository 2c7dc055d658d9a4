"""Faults: what a hung data node and the metadata engine's own failover cost a writer.

Each starts a cluster of its own (it stops a node, or kills a database), so
with ``--target`` neither runs. The figures are seconds, lower is better; each
beside its healthy or bare twin measured in the same trial.
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
from pathlib import Path
from time import perf_counter

from graben.store import Client, connect
from graben.store.cli._local import local_cluster, make_secret_file

from .._context import Context
from .._failover import failover, sync_pair
from .._kit import environ
from .._postgres import NoPostgres
from .._registry import Result, Skip, workload

MiB = 1 << 20
PUT = 4 * MiB
PUTS = 3
HEALTHY = "graben, all nodes up"


@workload("cluster-hung-node", "4 MiB puts at RF=3: all nodes up vs one node SIGSTOPped")
def cluster_hung_node(ctx: Context) -> list[Result]:
    """A node that answers nothing and refuses nothing (SIGSTOP: a hung disk, a host
    half dead) costs a writer one replica deadline (``Options.replica_deadline``, 3 s),
    then nothing: the node is passed over and the put writes two copies."""
    if ctx.target is not None:
        raise Skip("--target: the bench stops no node of a deployed cluster")
    root = ctx.scratch / "hung"
    root.mkdir()
    secret = make_secret_file(root / "secret")
    with (
        environ({"GRABEN_SECRET_FILE": str(secret)}),
        local_cluster(root, 3, secret) as url,
        connect(url, timeout=20, chunk_size=MiB) as client,
    ):
        node = _server_pid(root / "node0")
        client.put("/warm", os.urandom(MiB))  # connections open to every node
        healthy = statistics.median(_put(client, f"/up{i}") for i in range(PUTS))
        os.kill(node, signal.SIGSTOP)
        try:
            first = _put(client, "/first")
            after = statistics.median(_put(client, f"/after{i}") for i in range(PUTS))
        finally:
            os.kill(node, signal.SIGCONT)
    name, unit = "cluster-hung-node", "s"
    return [
        Result(name, HEALTHY, healthy, unit, HEALTHY),
        Result(name, "graben, one node SIGSTOPped: the first put", first, unit, HEALTHY),
        Result(name, "graben, one node SIGSTOPped: the puts after", after, unit, HEALTHY),
    ]


def _put(client: Client, path: str) -> float:
    data = os.urandom(PUT)
    start = perf_counter()
    client.put(path, data)
    return perf_counter() - start


def _server_pid(data: Path) -> int:
    """The pid of the ``graben node serve --data DATA`` process."""
    wanted = str(data)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            words = [a.decode(errors="replace") for a in argv]
            if "serve" in words and "--data" in words and wanted in words:
                return int(proc.name)
    raise LookupError(f"no data node serves {data}")


ENGINE = "PostgreSQL client alone (psycopg, the same URL)"
LOST = "acknowledged files lost"


@workload("meta-failover", "PostgreSQL primary killed under writes: seconds until writes resume")
def meta_failover(ctx: Context) -> list[Result]:
    """A primary with a synchronous standby under 4 writers and 2 metadata services,
    SIGKILLed and the standby promoted at once: seconds from the death until graben's
    writes go on, beside a bare psycopg client's on the same URL; and how many
    acknowledged files were lost (none may be)."""
    if ctx.target is not None:
        raise Skip("--target: the bench kills no database of a deployed cluster")
    try:
        pair = sync_pair()
    except NoPostgres as exc:
        raise Skip(str(exc)) from None
    try:
        outcome = failover(pair, ctx.scratch / "failover")
    finally:
        pair.close()
    ctx.console.print(
        f"meta-failover: {outcome.acked} files acknowledged, {len(outcome.lost)} lost"
        + "".join(f"\n  lost {line}" for line in outcome.lost[:5])
    )
    name = "meta-failover"
    return [
        Result(name, ENGINE, outcome.engine_s, "s", ENGINE),
        Result(name, "graben cluster, 2 services", outcome.resumed_s, "s", ENGINE),
        Result(name, LOST, len(outcome.lost), "files", LOST),
    ]
