"""``graben cluster up``: a metadata service (or several) and N data nodes on this
machine, as child processes; and the helpers that start and stop such servers
(the tests and the bench use them too).

``cluster up`` prints the cluster's URL on stdout once every node has
heartbeated (every metadata service's address in it), and stops them all on
Ctrl-C or SIGTERM. It gives ``meta serve`` ``--init`` on the first start in a
root, and refuses a root whose ``meta.db`` is gone while its nodes remain.
It makes a secret in its root (mode 0600) unless given one, and says what
clients should export.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from .._config import TLS
from .._errors import IntegrityError, InvalidArgument, Unavailable
from ..wire import auth
from ._cluster import READY_TIMEOUT_S, Subparsers
from ._listen import META_PORT, NODE_PORT, metrics_arg, metrics_at
from ._logs import log_arg
from ._main import config_arg
from ._tls import server_tls, server_tls_args, tls_flags, tls_hint


def add_cluster(sub: Subparsers) -> None:
    """``graben cluster up``."""
    cluster = sub.add_parser("cluster", help="Run a local cluster on loopback.")
    up = cluster.add_subparsers(metavar="ACTION", required=True).add_parser(
        "up", help="Start a metadata service and N data nodes; Ctrl-C stops them all."
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
        "nodes' (0: any free ports)",
    )
    log_arg(up)
    config_arg(up, "cluster")  # and its servers read [meta] and [node] of the same file
    up.set_defaults(run=_cluster_up)


def _node_listen(args: argparse.Namespace, i: int) -> tuple[str, ...]:
    """Node ``i``'s ``--listen``: ``--node-port`` + i, any port with ``--port 0``, else
    none (the first free from the default)."""
    if args.node_port is not None:
        return ("--listen", f"127.0.0.1:{args.node_port + i if args.node_port else 0}")
    return ("--listen", "127.0.0.1:0") if args.port == 0 else ()


def _spawn(*argv: str) -> tuple[subprocess.Popen[str], str]:
    """Start a ``graben`` server process; returns it and the address it listens on."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "graben.store.cli", *argv],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    try:
        line = proc.stdout.readline().strip()
    except BaseException:  # interrupted: leave nothing of it behind
        _abandon(proc)
        raise
    if not line.startswith("listening on "):
        _abandon(proc)
        raise Unavailable(f"graben {argv[0]} did not start (said {line!r})")
    return proc, line.removeprefix("listening on ")


def _abandon(proc: subprocess.Popen[str]) -> None:
    """A server that did not start: killed, reaped, and its pipe closed."""
    proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


@contextlib.contextmanager
def local_cluster(
    root: Path,
    nodes: int = 3,
    secret_file: Path | None = None,
    *,
    engine: str | None = None,
    services: int = 1,
    extra: tuple[str, ...] = (),
) -> Iterator[str]:
    """``graben cluster up`` in a child process for the block, on any free ports;
    yields the cluster's URL (every metadata service's address in it). ``extra``:
    more of its flags (``--tls-cert ...``).

    Its secret is ``secret_file``, else ``root/secret``; clients need it too.
    """
    secret = ("--secret-file", str(secret_file)) if secret_file else ()
    metadata = ("--services", str(services), *(("--engine", engine) if engine else ()))
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "graben.store.cli", "cluster", "up"),
            *(
                "--nodes",
                str(nodes),
                "--root",
                str(root),
                "--port",
                "0",
                *secret,
                *metadata,
                *extra,
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        if not url.startswith("graben://"):
            raise Unavailable(f"the local cluster did not start (said {url!r})")
        yield url
    finally:
        _stop([proc])


def _cluster_up(args: argparse.Namespace) -> int:
    if args.nodes < 1:
        raise InvalidArgument("a cluster needs at least one data node")
    root: Path = args.root
    root.mkdir(0o700, parents=True, exist_ok=True)
    replication = args.replication or min(3, args.nodes)
    secret_file: Path = (args.secret_file or make_secret_file(root / "secret")).resolve()
    tls = server_tls(args)
    shared: tuple[str, ...] = ("--secret-file", str(secret_file), *tls_flags(args))
    shared = (*shared, "--log-level", args.log_level)
    if args.s3_tier is not None:  # the same tier for the metadata service and every node
        shared = (*shared, "--s3-tier", args.s3_tier)
    sealed = (
        ()
        if args.encryption_key_file is None
        else ("--encryption-key-file", str(args.encryption_key_file.resolve()))
    )
    if args.config is not None:  # the servers take their own tables of it
        shared = (*shared, "--config", str(args.config.resolve()))
    procs: list[subprocess.Popen[str]] = []
    started = time.time()
    try:
        addresses = []
        for i, first in enumerate(_services(args.services, _first_start(root, args.engine))):
            meta, address = _spawn(
                "meta",
                "serve",
                *first,
                "--engine",
                args.engine or f"sqlite:///{root.resolve() / 'meta.db'}",
                "--listen",
                f"127.0.0.1:{args.port + i if args.port else 0}",
                "--replication",
                str(replication),
                "--heartbeat-timeout",
                str(args.heartbeat_timeout),
                *metrics_at(args.metrics, i and args.nodes + i),  # after the nodes' ports
                *shared,
            )
            procs.append(meta)
            addresses.append(address)
        address = addresses[0]
        for i in range(args.nodes):
            node, _ = _spawn(
                "node",
                "serve",
                "--data",
                str(root / f"node{i}"),
                "--meta",
                ",".join(addresses),
                "--rack",
                f"rack{i}",
                *_node_listen(args, i),
                *metrics_at(args.metrics, 1 + i),
                *sealed,
                *shared,
            )
            procs.append(node)
        token = auth.client_token(auth.load_secret(secret_file))
        _wait_for_nodes(f"graben://{address}", args.nodes, token, started, tls=tls)
        print(f"graben://{','.join(addresses)}", flush=True)
        print(
            f"graben cluster: {args.nodes} data nodes, replication {replication}; Ctrl-C stops it\n"
            f"clients need its secret: export GRABEN_SECRET_FILE={secret_file}" + tls_hint(tls),
            file=sys.stderr,
            flush=True,
        )
        _wait_for_signal()
    finally:
        _stop(procs)
    return 0


def _services(count: int, first: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    """The extra arguments of each of ``count`` metadata services: ``first``'s for the
    first (which makes the store if it is new), none for the others."""
    if count < 1:
        raise InvalidArgument("a cluster needs at least one metadata service")
    yield first
    for _ in range(count - 1):
        yield ()


def _first_start(root: Path, engine: str | None = None) -> tuple[str, ...]:
    """``("--init",)`` when the cluster in ``root`` is new; refuse a lost ``meta.db``
    beside data nodes that already belong to a store. With another ``engine``, the
    store is new if no data node in ``root`` belongs to one."""
    joined = sorted(str(p.parent) for p in root.glob("node*/store-id"))
    if engine is not None:
        return () if joined else ("--init",)
    if (root / "meta.db").exists():
        return ()
    if joined:
        raise IntegrityError(
            f"the metadata database is missing, but data nodes already belong to a store "
            f"({', '.join(joined)}); refusing to start a new, empty store over their "
            "chunks (restore meta.db)",
            str(root / "meta.db"),
        )
    return ("--init",)


def make_secret_file(path: Path) -> Path:
    """A new random secret in a 0600 file at ``path``, unless one is there already."""
    with contextlib.suppress(FileExistsError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(auth.new_secret() + "\n")
            f.flush()
            os.fsync(f.fileno())
    return path


def _wait_for_nodes(
    url: str, count: int, token: str | None = None, since: float = 0.0, *, tls: TLS | None = None
) -> None:
    """Return once ``count`` data nodes have heartbeated to the cluster at ``url`` (at or
    after unix time ``since``: a restarted cluster's engine still lists its nodes' old
    addresses, alive for a while yet). ``tls``: the servers' own TLS (``None``:
    plaintext, whatever the environment says)."""
    from ..client import connect

    deadline = time.monotonic() + READY_TIMEOUT_S
    with connect(url, token=token, tls=tls, wait=READY_TIMEOUT_S) as client:
        while time.monotonic() < deadline:
            nodes = client.health().nodes
            if sum(n.alive and n.last_seen >= since for n in nodes) >= count:
                return
            time.sleep(0.1)
    raise Unavailable(f"the data nodes did not all report to {url} within {READY_TIMEOUT_S} s")


def _wait_for_signal() -> None:
    stop = False

    def handle(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, handle)
    with contextlib.suppress(KeyboardInterrupt):
        while not stop:
            time.sleep(0.2)


def _stop(procs: list[subprocess.Popen[str]]) -> None:
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
