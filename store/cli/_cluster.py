"""``graben meta serve``, ``graben node serve`` and ``graben cluster up``.

Each server prints one line, ``listening on HOST:PORT``, once it accepts
connections, then runs until SIGINT or SIGTERM. ``HOST:PORT`` is the address
others are told to dial: ``--advertise`` if given, else ``--listen``'s.
Default ports: the metadata service 7100, a data node the first free one from
7200 upward on its ``--listen`` host; ``--listen HOST:0`` picks any free port
(tests do, to run side by side).
``cluster up`` starts a metadata service and N data nodes as child
processes, prints the cluster's URL on stdout once every node has
heartbeated, and stops them all on Ctrl-C. ``meta serve`` creates a new
store only with ``--init``; ``cluster up`` gives it on the first start in a
root, and refuses a root whose ``meta.db`` is gone while its nodes remain.

Every server needs the cluster secret: ``--secret-file``, else
``$GRABEN_SECRET`` / ``$GRABEN_SECRET_FILE``. ``cluster up`` makes one in its
root (mode 0600) unless given one, and says what clients should export.

TLS: every server takes ``--tls-cert``, ``--tls-key``, ``--tls-ca`` and
``--tls-client-auth`` (``_tls``); ``cluster up`` passes them to its servers.

Over 500 lines: the server commands, the local cluster that spawns them and
``status`` share their flags and helpers; ``status`` is the next to move out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias
from urllib.parse import urlsplit

from .._config import TLS, resolve
from .._errors import IntegrityError, InvalidArgument, NotFound, Unavailable
from ..wire import DEFAULT_IDLE_TIMEOUT, auth
from ._listen import (
    META_PORT,
    NODE_PORT,
    advertised,
    check_advertise,
    endpoints_arg,
    listen_args,
    metrics_arg,
    metrics_at,
    start_node,
    told,
)
from ._logs import log_arg
from ._main import config_arg
from ._stores import timeout_arg
from ._tls import client_tls, server_tls, server_tls_args, tls_arg, tls_flags, tls_hint

if TYPE_CHECKING:
    from ..meta import Repository, SQLiteRepository

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
READY_TIMEOUT_S = 30.0


def _server_args(serve: argparse.ArgumentParser, section: str) -> None:
    """What every server takes: idle timeout, metrics, secret, TLS, log level, config
    ``[section]``."""
    serve.add_argument(
        "--idle-timeout",
        type=float,
        default=DEFAULT_IDLE_TIMEOUT,
        help="seconds before a connection that sends nothing is dropped",
    )
    metrics_arg(serve)
    serve.add_argument(
        "--secret-file",
        type=Path,
        default=None,
        help="file holding the cluster secret, mode 0600 (default: $GRABEN_SECRET_FILE)",
    )
    server_tls_args(serve)
    log_arg(serve)
    config_arg(serve, section)


def add_meta(sub: Subparsers) -> None:
    """``graben meta serve``."""
    meta = sub.add_parser("meta", help="Run the metadata service.")
    serve = meta.add_subparsers(metavar="ACTION", required=True).add_parser(
        "serve", help="Serve the namespace of an engine to clients and data nodes."
    )
    serve.add_argument(
        "--engine",
        required=True,
        help="sqlite:///path/to/meta.db or postgresql://user@host:port/dbname (password: "
        "~/.pgpass or $PGPASSWORD)",
    )
    serve.add_argument(
        "--init",
        action="store_true",
        help="create a new, empty store if the engine has none (without it, a missing or "
        "empty database is an error: a mistyped path must not pass for a new store)",
    )
    listen_args(serve, f"127.0.0.1:{META_PORT}", f"default 127.0.0.1:{META_PORT}")
    serve.add_argument("--replication", type=int, default=3, help="default copies per chunk")
    serve.add_argument(
        "--min-replicas",
        type=int,
        default=0,
        help="copies a write needs when nodes are down (default: one fewer than it asks "
        "for, at least 1); repair adds the rest",
    )
    serve.add_argument(
        "--heartbeat-timeout", type=float, default=10.0, help="seconds before a silent node is dead"
    )
    serve.add_argument(
        "--repair-interval", type=float, default=5.0, help="seconds between repair rounds"
    )
    _server_args(serve, "meta")
    serve.set_defaults(run=_meta_serve)


def add_node(sub: Subparsers) -> None:
    """``graben node serve``."""
    node = sub.add_parser("node", help="Run a data node.")
    serve = node.add_subparsers(metavar="ACTION", required=True).add_parser(
        "serve", help="Serve a chunk directory and heartbeat to the metadata service."
    )
    serve.add_argument("--data", type=Path, required=True, help="directory for chunk files")
    serve.add_argument(
        "--meta",
        type=endpoints_arg,
        required=True,
        help="metadata service HOST:PORT; several (HOST:PORT,HOST:PORT) for a cluster with "
        "more than one: heartbeats go to whichever answers",
    )
    serve.add_argument("--rack", default="default", help="failure domain label")
    listen_args(
        serve, "127.0.0.1", f"default 127.0.0.1, on the first free port from {NODE_PORT} up"
    )
    serve.add_argument(
        "--scrub-interval", type=float, default=3600.0, help="seconds between scrubs of all chunks"
    )
    _server_args(serve, "node")
    serve.set_defaults(run=_node_serve)


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
        help=f"metadata service port (default {META_PORT}; the nodes take {NODE_PORT} and up); "
        "0: any free ports, for the service and the nodes",
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


def add_status(sub: Subparsers) -> None:
    """``graben status``."""
    status = sub.add_parser(
        "status",
        help="Show the engine, the metadata services and which one leads, data nodes, "
        "capacity, and chunks short of copies or damaged.",
    )
    status.add_argument(
        "--store", default=None, help="store URL or directory (default: $GRABEN_URL)"
    )
    status.add_argument("--json", action="store_true", help="print JSON")
    timeout_arg(status)
    tls_arg(status)
    status.set_defaults(run=_status)


def _status(args: argparse.Namespace) -> int:
    import msgspec

    from ._render import emit_lines, status_lines
    from ._stores import open_client

    with open_client(args.store, create=True, timeout=args.timeout, tls=client_tls(args)) as client:
        health = client.health()
    cluster = resolve(args.store).address is not None
    dead = cluster and not any(n.alive for n in health.nodes)
    # The same exit code for text and JSON: scripts and monitors read either.
    healthy = health.degraded == 0 and health.bad == 0 and not dead
    if args.json:
        print(msgspec.json.encode(health).decode())
        return 0 if healthy else 1
    emit_lines(status_lines(health, cluster=cluster))
    return 0 if healthy else 1


# -- serving ------------------------------------------------------------------


def _serve(start: Callable[[], Awaitable[tuple[str, Callable[[], Awaitable[None]]]]]) -> int:
    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        where, close = await start()
        print(f"listening on {where}", flush=True)
        try:
            await stop.wait()
        finally:
            await close()

    asyncio.run(main())
    return 0


def _engine_path(engine: str) -> Path:
    parts = urlsplit(engine)
    if parts.scheme != "sqlite" or not parts.path:
        raise InvalidArgument(
            f"unsupported engine {engine!r}: use sqlite:///path/to/meta.db "
            "or postgresql://user@host:port/dbname"
        )
    return Path("/" + parts.path.lstrip("/"))  # sqlite:////abs and sqlite:///abs alike


def _meta_serve(args: argparse.Namespace) -> int:
    from ..meta import MetaService, is_postgres

    path = None if is_postgres(args.engine) else _engine_path(args.engine)
    check_advertise(args.listen, args.advertise)
    secret = auth.load_secret(args.secret_file)
    tls = server_tls(args)
    if path is None:
        repo: Repository = _open_postgres(args.engine, init=args.init)
    else:
        repo = _open_engine(path, init=args.init)
    host, port = args.listen

    async def start() -> tuple[str, Callable[[], Awaitable[None]]]:
        service = MetaService(
            repo,
            secret=secret,
            replication=args.replication,
            min_replicas=args.min_replicas,
            heartbeat_timeout=args.heartbeat_timeout,
            repair_interval=args.repair_interval,
            idle_timeout=args.idle_timeout,
            metrics=args.metrics,
            tls=tls,
        )
        server = await service.start(
            host, META_PORT if port is None else port, advertise=told(args.advertise)
        )
        return advertised(args.listen, server.port, args.advertise), service.close

    return _serve(start)


def _open_engine(path: Path, *, init: bool) -> SQLiteRepository:
    """The engine at ``path``: created only with ``init``."""
    from ..meta import SQLiteRepository

    if init:
        path.parent.mkdir(0o700, parents=True, exist_ok=True)
    try:
        return SQLiteRepository(path, create=init)
    except NotFound as exc:
        raise NotFound(
            f"{exc.message}; to create a new, empty store there, give --init", exc.path
        ) from None


def _open_postgres(url: str, *, init: bool) -> Repository:
    """The PostgreSQL engine at ``url``: its store created only with ``init``."""
    from ..meta import open_postgres

    try:
        return open_postgres(url, create=init)
    except NotFound as exc:
        raise NotFound(
            f"{exc.message}; to create a new, empty store there, give --init", exc.path
        ) from None


def _node_serve(args: argparse.Namespace) -> int:
    from ..node import DataNode

    check_advertise(args.listen, args.advertise)
    secret = auth.load_secret(args.secret_file)
    tls = server_tls(args)

    async def start() -> tuple[str, Callable[[], Awaitable[None]]]:
        node = DataNode(
            args.data,
            rack=args.rack,
            meta=args.meta,
            secret=secret,
            scrub_interval=args.scrub_interval,
            idle_timeout=args.idle_timeout,
            metrics=args.metrics,
            tls=tls,
        )
        await start_node(node, args.listen, args.advertise)
        return node.address, node.close

    return _serve(start)


# -- a local cluster ------------------------------------------------------------


def _spawn(*argv: str) -> tuple[subprocess.Popen[str], str]:
    """Start a ``graben`` server process; returns it and the address it listens on."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "graben.store.cli", *argv],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("listening on "):
        proc.kill()
        raise Unavailable(f"graben {argv[0]} did not start (said {line!r})")
    return proc, line.removeprefix("listening on ")


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
                *(("--listen", "127.0.0.1:0") if args.port == 0 else ()),
                *metrics_at(args.metrics, 1 + i),
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
    from ..client import connect, run_sync
    from ..transport import ListNodes

    deadline = time.monotonic() + READY_TIMEOUT_S
    with connect(url, token=token, tls=tls) as client:
        while time.monotonic() < deadline:
            nodes = run_sync(client.aio.meta.request(ListNodes()))
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
