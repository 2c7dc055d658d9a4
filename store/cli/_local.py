"""``graben cluster up``: its flags, and the foreground wait. The servers are
``graben.store.local``'s ``LocalCluster``: a metadata service (or several) and N
data nodes on this machine, as child processes.

``cluster up`` prints the cluster's URL on stdout once every node has
heartbeated (every metadata service's address in it), and stops them all on
Ctrl-C or SIGTERM. It gives ``meta serve`` ``--init`` on the first start in a
root, and refuses a root whose ``meta.db`` is gone while its nodes remain.
It makes a secret in its root (mode 0600) unless given one, and says what
clients should export. A server that dies is named on stderr with its return
code and started again on its address, 1 s later, then 2, 4, ... up to 30 s
each time it dies again (1 s again once it has stayed up a minute).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
from pathlib import Path

from .._errors import InvalidArgument
from ..local import LocalCluster, is_new_store, make_secret_file
from ..wire import METRICS_OFFSET
from ._cluster import Subparsers, collect_args
from ._listen import META_PORT, NODE_PORT, metrics_arg
from ._logs import log_arg
from ._main import config_arg
from ._page import agents_flags, page_address, status_args
from ._tls import server_tls, server_tls_args, tls_flags, tls_hint


def add_cluster(sub: Subparsers) -> None:
    """``graben cluster up``."""
    cluster = sub.add_parser("cluster", help="Run a local cluster on loopback.")
    up = cluster.add_subparsers(metavar="ACTION", required=True).add_parser(
        "up",
        help="Start a metadata service and N data nodes; Ctrl-C stops them all.",
        description="Start a metadata service (or several) and N data nodes on this machine; "
        "Ctrl-C or SIGTERM stops them all. A server that dies is logged on stderr (which "
        "one, its pid and its return code) and restarted on its address after 1 s, doubling "
        "up to 30 s each time it dies again (back to 1 s once it has stayed up a minute).",
    )
    up.add_argument("--nodes", type=int, default=3, help="data nodes (each its own rack)")
    up.add_argument("--root", type=Path, required=True, help="directory for all their data")
    up.add_argument(
        "--port",
        type=int,
        default=META_PORT,
        help=f"metadata service port (default {META_PORT}); "
        "0: any free ports, for the service and the nodes",
    )
    up.add_argument(
        "--node-port",
        type=int,
        default=None,
        metavar="PORT",
        help=f"the data nodes listen on PORT, PORT+1, ... (default: the first free ones from "
        f"{NODE_PORT})",
    )
    up.add_argument("--replication", type=int, default=None, help="default: min(3, nodes)")
    up.add_argument(
        "--engine",
        default=None,
        metavar="URL",
        help="the metadata's engine, e.g. postgresql://USER@HOST:PORT/DB (default: ROOT/meta.db)",
    )
    up.add_argument(
        "--services",
        type=int,
        default=1,
        help="metadata services on the engine, on PORT, PORT+1, ... (default: 1)",
    )
    up.add_argument("--heartbeat-timeout", type=float, default=10.0)
    collect_args(up, passed_on=True)
    up.add_argument(
        "--encryption-key-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="the nodes encrypt chunk files at rest with this key (see graben node serve --help)",
    )
    up.add_argument(
        "--s3-tier",
        metavar="s3://BUCKET/PREFIX",
        default=None,
        help="an S3 tier for chunks of class s3 (see graben meta serve --help)",
    )
    up.add_argument(
        "--secret-file",
        type=Path,
        default=None,
        help="cluster secret (default: ROOT/secret, made on first start)",
    )
    server_tls_args(up)
    metrics_arg(
        up,
        "the metadata service's on PORT, node i's on PORT+1+i, more services' after the "
        f"nodes' (0: any free ports); default: each server's own port + {METRICS_OFFSET}",
    )
    status_args(up, passed_on=True)
    log_arg(up)
    config_arg(up, "cluster")  # and its servers read [meta] and [node] of the same file
    up.set_defaults(run=_cluster_up)


def _cluster_up(args: argparse.Namespace) -> int:
    if args.nodes < 1:  # refused before the root is made (LocalCluster refuses it too)
        raise InvalidArgument("a cluster needs at least one data node")
    root: Path = args.root
    root.mkdir(0o700, parents=True, exist_ok=True)
    secret_file: Path = (args.secret_file or make_secret_file(root / "secret")).resolve()
    tls = server_tls(args)
    shared = (*tls_flags(args), "--log-level", args.log_level)
    given = {
        "--collect-grace": args.collect_grace,
        "--collect-per-round": args.collect_per_round,
        "--orphan-grace": args.orphan_grace,
    }
    collecting = [item for flag, v in given.items() if v is not None for item in (flag, str(v))]
    if args.s3_tier is not None:  # the same tier for the metadata service and every node
        shared = (*shared, "--s3-tier", args.s3_tier)
    sealed = (
        ()
        if args.encryption_key_file is None
        else ("--encryption-key-file", str(args.encryption_key_file.resolve()))
    )
    if args.config is not None:  # the servers take their own tables of it
        shared = (*shared, "--config", str(args.config.resolve()))
    with LocalCluster(
        root,
        args.nodes,
        metas=args.services,
        engine=args.engine,
        init=is_new_store(root, args.engine),
        replication=args.replication,
        heartbeat_timeout=args.heartbeat_timeout,
        port=args.port,
        node_port=_node_port(args),
        metrics=args.metrics,
        secret_file=secret_file,
        meta_args=(*shared, *collecting, *agents_flags(args)),
        node_args=(*sealed, *shared),
        tls=tls,
        status=page_address(args),
    ) as cluster:
        print(cluster.url, flush=True)
        print(
            f"graben cluster: {args.nodes} data nodes, replication {cluster.replication}; "
            "Ctrl-C stops it\n"
            f"clients need its secret: export GRABEN_SECRET_FILE={secret_file}"
            + tls_hint(tls)
            + _page_hint(cluster.status_address),
            file=sys.stderr,
            flush=True,
        )
        _wait_for_signal(cluster)
    return 0


def _page_hint(where: str) -> str:
    if not where:
        return ""
    return f"\nstatus page at http://{where}/ (its token: graben token cluster)"


def _node_port(args: argparse.Namespace) -> int | None:
    """The nodes' first port: ``--node-port``; any with ``--port 0``; else none (each
    the first free from the default)."""
    if args.node_port is not None:
        return int(args.node_port)
    return 0 if args.port == 0 else None


def _wait_for_signal(cluster: LocalCluster) -> None:
    """Tend the cluster (its dead servers restarted) until Ctrl-C or SIGTERM."""
    stop = False

    def handle(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, handle)
    with contextlib.suppress(KeyboardInterrupt):
        while not stop:
            cluster.tend(_say)
            time.sleep(0.2)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
