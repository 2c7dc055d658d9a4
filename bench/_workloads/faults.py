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
from graben.store.local import cluster_up, make_secret_file

from .._context import Context
from .._failover import failover, sync_pair
from .._kit import environ
from .._postgres import NoPostgres
from .._registry import Result, Skip, workload

MiB = 1 << 20
PUT = 4 * MiB
PUTS = 3
HEALTHY = "graben, all nodes up"


@workload("cluster-hung-node", "4 MiB puts and gets, RF=3: all nodes up vs one SIGSTOPped")
def cluster_hung_node(ctx: Context) -> list[Result]:
    """A node that answers nothing and refuses nothing (SIGSTOP: a hung disk, a host
    half dead) costs a writer one replica deadline (``Options.replica_deadline``, 3 s),
    then nothing: the node is passed over and the put writes two copies. A reader
    whose first copy is on it asks the next one after the deadline, and then passes
    it over (a new client, as a new process would be)."""
    if ctx.target is not None:
        raise Skip("--target: the bench stops no node of a deployed cluster")
    root = ctx.scratch / "hung"
    root.mkdir()
    secret = make_secret_file(root / "secret")
    with (
        environ({"GRABEN_SECRET_FILE": str(secret)}),
        cluster_up(root, 3, secret) as url,
        connect(url, timeout=20, chunk_size=MiB) as client,
    ):
        client.put("/warm", os.urandom(MiB))  # connections open to every node
        healthy = statistics.median(_put(client, f"/up{i}") for i in range(PUTS))
        client.put("/before", os.urandom(PUT))
        read = statistics.median(_get(client, "/before") for _ in range(PUTS))
        node = _server_pid(_first_copy(client, root, "/before"))  # readers ask it first
        os.kill(node, signal.SIGSTOP)
        try:
            first = _put(client, "/first")
            after = statistics.median(_put(client, f"/after{i}") for i in range(PUTS))
            with connect(url, timeout=20, chunk_size=MiB) as fresh:  # knows nothing slow
                first_read = _get(fresh, "/before")
                later = statistics.median(_get(fresh, "/before") for _ in range(PUTS))
        finally:
            os.kill(node, signal.SIGCONT)
    name, unit, stopped = "cluster-hung-node", "s", "graben, one node SIGSTOPped"
    return [
        Result(name, HEALTHY, healthy, unit, HEALTHY),
        Result(name, f"{stopped}: the first put", first, unit, HEALTHY),
        Result(name, f"{stopped}: the puts after", after, unit, HEALTHY),
        Result(name, READ, read, unit, READ),
        Result(name, f"{stopped}, read first: a new client's get", first_read, unit, READ),
        Result(name, f"{stopped}, read first: the gets after", later, unit, READ),
    ]


READ = "graben, all nodes up: get"


def _get(client: Client, path: str) -> float:
    start = perf_counter()
    client.get(path)
    return perf_counter() - start


def _first_copy(client: Client, root: Path, path: str) -> Path:
    """The data directory of the node a reader of ``path``'s first chunk asks first."""
    layout = client.layout(path)
    first = layout.replicas[layout.extents[0].chunk.id][0]
    for data in root.glob("node*"):
        if (data / "node-id").exists() and (data / "node-id").read_text().strip() == first:
            return data
    raise LookupError(f"no data node here has id {first}")


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
