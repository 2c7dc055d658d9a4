"""``graben meta serve``, ``graben node serve`` and ``graben status``.

Each server prints one line, ``listening on HOST:PORT``, once it accepts
connections, then runs until SIGINT or SIGTERM. ``HOST:PORT`` is the address
others are told to dial: ``--advertise`` if given, else ``--listen``'s.
Default ports: the metadata service 7100, a data node the first free one from
7200 upward on its ``--listen`` host; ``--listen HOST:0`` picks any free port
(tests do, to run side by side).
``cluster up`` (``_local``, with ``graben.store.local``) starts them on this
machine. ``meta serve`` creates a new store only with ``--init``.

Every server needs the cluster secret: ``--secret-file``, else
``$GRABEN_SECRET`` / ``$GRABEN_SECRET_FILE``.

TLS: every server takes ``--tls-cert``, ``--tls-key``, ``--tls-ca`` and
``--tls-client-auth`` (``_tls``); ``cluster up`` passes them to its servers.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import resource
import signal
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias
from urllib.parse import urlsplit

from .._config import encryption_key_file, resolve
from .._errors import GrabenError, InvalidArgument, NotFound
from ..meta import COLLECT_CHUNKS, COLLECT_GRACE_S, INLINE_LIMIT, INLINE_MAX, SWEEP_GRACE_S
from ..wire import DEFAULT_IDLE_TIMEOUT, auth
from ._backup import add_backup
from ._listen import (
    META_PORT,
    NODE_PORT,
    advertise_address,
    advertised,
    check_advertise,
    endpoints_arg,
    listen_args,
    metrics_arg,
    metrics_at,
    size_arg,
    start_node,
)
from ._logs import log_arg
from ._main import config_arg
from ._nodes import add_node_actions
from ._page import status_args, status_page
from ._stores import timeout_arg
from ._tls import server_tls, server_tls_args, tls_arg

if TYPE_CHECKING:
    from ..meta import Repository, SQLiteRepository

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
OPEN_FILES = 65536
"""Descriptors a server asks for at start: each client connection holds one, and a
thousand-rank job holds a thousand connections to the metadata service and to each
data node."""
LOW_OPEN_FILES = 4096
"""Below this many descriptors, a server warns that large jobs cannot all connect."""
log = logging.getLogger("graben.cli")


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
    secret_arg(serve)
    server_tls_args(serve)
    log_arg(serve)
    config_arg(serve, section)


def secret_arg(serve: argparse.ArgumentParser) -> None:
    """``--secret-file``, which every server takes."""
    serve.add_argument(
        "--secret-file",
        type=Path,
        default=None,
        help="file holding the cluster secret, mode 0600 (default: $GRABEN_SECRET_FILE)",
    )


def add_meta(sub: Subparsers) -> None:
    """``graben meta serve``, ``backup`` and ``restore``."""
    meta = sub.add_parser("meta", help="Run the metadata service; back its engine up.")
    actions = meta.add_subparsers(metavar="ACTION", required=True)
    serve = actions.add_parser(
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
        "--inline-max",
        type=int,
        default=INLINE_MAX,
        help=f"files up to this many bytes are kept in the metadata engine itself, not on "
        f"the nodes (default {INLINE_MAX}; 0: none; at most {INLINE_LIMIT})",
    )
    serve.add_argument(
        "--heartbeat-timeout", type=float, default=10.0, help="seconds before a silent node is dead"
    )
    serve.add_argument(
        "--repair-interval",
        type=float,
        default=5.0,
        help="seconds between rounds of the leader's duties (repair, conversion, collection)",
    )
    serve.add_argument(
        "--rebalance-rate",
        type=size_arg,
        default=16 << 20,
        metavar="BYTES",
        help="bytes a second the leader moves from fuller data nodes to emptier ones, until "
        "each holds within 10%% of the mean (default 16M; 0: never; config key "
        "rebalance-rate)",
    )
    collect_args(serve)
    status_args(serve)
    _tier_arg(serve, "chunks of class s3 are uploaded there")
    _server_args(serve, "meta")
    serve.set_defaults(run=_meta_serve)
    add_backup(actions)


def collect_args(parser: argparse.ArgumentParser, *, passed_on: bool = False) -> None:
    """``--collect-grace`` and ``--collect-per-round``: the leader's collection (with
    ``passed_on``, ``None`` unless given: the command passes them on to its services,
    whose config file says the rest)."""
    parser.add_argument(
        "--collect-grace",
        type=grace_arg,
        default=None if passed_on else COLLECT_GRACE_S,
        metavar="SECONDS",
        help="the leader deletes chunks no file has used for this long (after rm, a "
        "replaced file, a checkpoint rotated out), with no command (default "
        f"{COLLECT_GRACE_S:g}; inf: never, fsck --collect does)",
    )
    parser.add_argument(
        "--collect-per-round",
        type=int,
        default=None if passed_on else COLLECT_CHUNKS,
        metavar="CHUNKS",
        help=f"chunks a round of the leader's duties collects at most (default {COLLECT_CHUNKS})",
    )
    parser.add_argument(
        "--orphan-grace",
        type=grace_arg,
        default=None if passed_on else SWEEP_GRACE_S,
        metavar="SECONDS",
        help="the leader deletes chunk files no metadata names (of uploads whose writer "
        "died before committing, copies a node held while it was down) once this old "
        f"(default {SWEEP_GRACE_S:g}: a writer's receipt life; inf: never, fsck --collect "
        "does)",
    )


def grace_arg(text: str) -> float:
    """Seconds, 0 or more (``inf``: never)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 seconds or more, not {text}")
    return value


def add_node(sub: Subparsers) -> None:
    """``graben node serve``, ``node drain ID``, ``node rm ID``."""
    node = sub.add_parser(
        "node",
        help="Run, drain or remove a data node.",
        description="Run a data node (serve), move every copy off one before retiring its "
        "host (drain; status shows the copies left, then 'drained'), and forget a drained, "
        "stopped one (rm).",
    )
    actions = node.add_subparsers(metavar="ACTION", required=True)
    serve = actions.add_parser(
        "serve", help="Serve a chunk directory and heartbeat to the metadata service."
    )
    add_node_actions(actions)
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
    _tier_arg(serve, "chunks of class s3 are read through from there")
    serve.add_argument(
        "--encryption-key-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="encrypt chunk files at rest with the store's key (32 bytes, or 64 hex digits; "
        "0600; default: $GRABEN_ENCRYPTION_KEY_FILE, else none); every node of a store "
        "takes the same key, chosen when the store is made",
    )
    serve.add_argument(
        "--s3-cache",
        type=size_arg,
        default=10 << 30,
        metavar="SIZE",
        help="bytes of S3-tier chunks this node keeps in DATA/cache (default 10G)",
    )
    _server_args(serve, "node")
    serve.set_defaults(run=_node_serve)


def _tier_arg(serve: argparse.ArgumentParser, what: str) -> None:
    serve.add_argument(
        "--s3-tier",
        metavar="s3://BUCKET/PREFIX",
        default=None,
        help=f"the cluster's S3 tier: {what} (credentials and endpoint: the AWS "
        "environment, then ~/.aws/credentials and ~/.aws/config; needs graben[s3])",
    )


def add_status(sub: Subparsers) -> None:
    """``graben status``."""
    status = sub.add_parser(
        "status",
        help="Show the engine, the metadata services and which one leads, data nodes, "
        "capacity, and chunks short of copies or damaged.",
        description="Show the engine, the metadata services and which one leads, and each "
        "data node: up or DEAD, the bytes graben's files take on its disk (graben), its "
        "disk's free and total bytes, and when its last full scrub pass ended; then chunks "
        "short of copies and damaged copies. Exit 1 if any chunk is short or damaged, or no "
        "data node is alive.",
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

    with open_client(args.store, args) as client:
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


def raise_open_files(want: int = OPEN_FILES) -> int:
    """Raise this process's soft limit on open files towards ``want`` (never past the hard
    limit, which only root may raise); the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return target
    return soft


Started: TypeAlias = tuple[str, Callable[[], Awaitable[None]], Awaitable[GrabenError] | None]
"""What a server's start gives ``_serve``: where it listens, how to close it, and what
ends it from within, with the error to exit with (``None``: only a signal ends it)."""


def _serve(start: Callable[[], Awaitable[Started]], said: Sequence[str] = ()) -> int:
    """Run a server until a signal (or its own end); ``said``: lines printed after the
    first, ``listening on``, once ``start`` has filled them in."""
    limit = raise_open_files()
    if limit < LOW_OPEN_FILES:
        log.warning(
            "open files limited to %d (hard limit): at most about that many clients can "
            "connect; raise it (ulimit -Hn, LimitNOFILE=) for large jobs",
            limit,
        )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        where, close, ended = await start()
        print(f"listening on {where}", flush=True)
        for line in said:
            print(line, flush=True)
        stopped = asyncio.ensure_future(stop.wait())
        ending = None if ended is None else asyncio.ensure_future(ended)
        try:
            await asyncio.wait(
                [stopped] if ending is None else [stopped, ending],
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            await close()
            stopped.cancel()
            if ending is not None:
                ending.cancel()  # a no-op once it has ended
        if ending is not None and ending.done() and not ending.cancelled():
            raise ending.result()

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
    said: list[str] = []  # where the status page serves, once it does

    async def start() -> Started:
        service = MetaService(
            repo,
            secret=secret,
            replication=args.replication,
            min_replicas=args.min_replicas,
            inline_max=args.inline_max,
            heartbeat_timeout=args.heartbeat_timeout,
            repair_interval=args.repair_interval,
            rebalance_rate=args.rebalance_rate,
            collect_grace=args.collect_grace,
            collect_per_round=args.collect_per_round,
            orphan_grace=args.orphan_grace,
            idle_timeout=args.idle_timeout,
            metrics=metrics_at(args.metrics, args.listen),
            tls=tls,
            tier=args.s3_tier,
            counted=args.status is not None,
        )
        server = await service.start(
            host, META_PORT if port is None else port, advertise=advertise_address(args.advertise)
        )
        where = advertised(args.listen, server.port, args.advertise)
        close = await status_page(service, args, secret, said)
        return where, close, service.until_outdated()

    return _serve(start, said)


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
    from ..node import DataNode, load_key

    check_advertise(args.listen, args.advertise)
    secret = auth.load_secret(args.secret_file)
    tls = server_tls(args)
    key = args.encryption_key_file or encryption_key_file()
    sealer = None if key is None else load_key(key)

    async def start() -> Started:
        node = DataNode(
            args.data,
            rack=args.rack,
            meta=args.meta,
            secret=secret,
            scrub_interval=args.scrub_interval,
            idle_timeout=args.idle_timeout,
            metrics=metrics_at(args.metrics, args.listen),
            tls=tls,
            tier=args.s3_tier,
            tier_cache=args.s3_cache,
            sealer=sealer,
        )
        await start_node(node, args.listen, args.advertise)
        return node.address, node.close, None

    return _serve(start)


# -- a local cluster ------------------------------------------------------------
