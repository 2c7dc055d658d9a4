"""``graben agent serve`` (a node's memory agent for checkpoints), ``graben agent status``
and ``graben agent drop JOB``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TypeAlias

from .._config import AGENT_PORT
from ..wire import auth
from ._cluster import Started, _serve, secret_arg
from ._listen import endpoint, endpoints_arg, metrics_arg, metrics_at, size_arg
from ._logs import log_arg
from ._main import config_arg

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
DEFAULT_DIR = Path("/dev/shm/graben-agent")


def _keep(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--keep is at least 1, not {text!r}")
    return int(text)


def _peers(text: str) -> tuple[str, ...]:
    peers = tuple(p.strip() for p in text.split(",") if p.strip())
    for peer in peers:
        host, _, port = peer.rpartition(":")
        if not host or not port.isdigit():
            raise argparse.ArgumentTypeError(f"{peer!r} is not HOST:PORT")
    return peers


def add_agent(sub: Subparsers) -> None:
    """``graben agent serve`` / ``graben agent status``."""
    agent = sub.add_parser("agent", help="A node's memory tier for checkpoints.")
    actions = agent.add_subparsers(metavar="ACTION", required=True)
    serve = actions.add_parser(
        "serve", help="Hold checkpoints in this node's shared memory; copy them to a peer."
    )
    serve.add_argument(
        "--dir", type=Path, default=DEFAULT_DIR, help=f"shared-memory directory ({DEFAULT_DIR})"
    )
    serve.add_argument(
        "--memory-limit",
        type=size_arg,
        required=True,
        metavar="SIZE",
        help="most bytes of segments held, e.g. 8G (required)",
    )
    serve.add_argument("--keep", type=_keep, default=2, help="newest steps kept per rank (2)")
    serve.add_argument(
        "--listen",
        type=endpoint,
        default=f"127.0.0.1:{AGENT_PORT}",
        help=f"HOST[:PORT] to bind (default 127.0.0.1:{AGENT_PORT}; ranks find it "
        "through $GRABEN_AGENT)",
    )
    serve.add_argument(
        "--peer",
        type=_peers,
        default=(),
        help="HOST:PORT[,...] of agents on other hosts: each finished segment is copied "
        "to the first that takes it",
    )
    serve.add_argument(
        "--meta",
        type=endpoints_arg,
        default=(),
        help="metadata service HOST:PORT[,...]: what a tenant's token reaches is asked there "
        "(without it, ranks need the cluster's token)",
    )
    metrics_arg(serve)
    secret_arg(serve)
    log_arg(serve)
    config_arg(serve, "agent")
    serve.set_defaults(run=_agent_serve)
    status = actions.add_parser("status", help="What the agent holds, against its limit.")
    status.add_argument("--agent", default=None, help="HOST:PORT (default: $GRABEN_AGENT)")
    status.set_defaults(run=_agent_status)
    drop = actions.add_parser("drop", help="Drop every step a job holds in the agent's memory.")
    drop.add_argument("job", help="the job's checkpoint root URL, as its CheckpointManager has it")
    drop.add_argument("--agent", default=None, help="HOST:PORT (default: $GRABEN_AGENT)")
    drop.set_defaults(run=_agent_drop)


def _agent_serve(args: argparse.Namespace) -> int:
    from ..agent import Agent

    secret = auth.load_secret(args.secret_file)
    host, port = args.listen

    async def start() -> Started:
        agent = Agent(
            args.dir,
            limit=args.memory_limit,
            secret=secret,
            keep=args.keep,
            peers=args.peer,
            metrics_at=metrics_at(args.metrics, args.listen),
            meta=args.meta,
        )
        server = await agent.start(host, AGENT_PORT if port is None else port)
        return f"{host}:{server.port}", agent.close, None

    return _serve(start)


def _agent_status(args: argparse.Namespace) -> int:
    from ..client import AgentClient

    client = AgentClient(args.agent)
    try:
        status = client.status()
    finally:
        client.close()
    peers = ", ".join(status.peers) or "none"
    print(
        f"{client.address}: {status.segments} segments, {status.held_bytes} of "
        f"{status.limit_bytes} bytes; peers: {peers}"
    )
    return 0


def _agent_drop(args: argparse.Namespace) -> int:
    from ..client import AgentClient

    client = AgentClient(args.agent)
    try:
        dropped = client.drop(args.job.rstrip("/"))
    finally:
        client.close()
    print(f"dropped {dropped} segments of {args.job}")
    return 0
