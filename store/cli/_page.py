"""``--status [HOST[:PORT]]`` and ``--status-agents``: a metadata service's read-only
status page (``graben.store.meta``'s ``StatusPage``), off unless asked for; and
``graben token cluster``, the operator's token to show it."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..wire import auth
from ._listen import endpoint, endpoints_arg

if TYPE_CHECKING:
    from ..meta import MetaService

STATUS_PORT = 7180
"""The status page's port when ``--status`` names none."""


def status_args(parser: argparse.ArgumentParser, *, passed_on: bool = False) -> None:
    """``--status`` and ``--status-agents`` (``passed_on``: ``graben cluster up``'s, which
    its first metadata service serves)."""
    parser.add_argument(
        "--status",
        type=endpoint,
        nargs="?",
        const=("127.0.0.1", STATUS_PORT),
        default=None,
        metavar="HOST[:PORT]",
        help="serve a read-only status page at http://HOST:PORT/ behind the API's tokens "
        f"(the flag alone: 127.0.0.1:{STATUS_PORT}; PORT 0: any free one; default: none)"
        + ("; the first metadata service's" if passed_on else ""),
    )
    parser.add_argument(
        "--status-agents",
        type=agents_arg,
        default=(),
        metavar="HOST:PORT,...",
        help="memory agents the status page asks which checkpoint jobs they hold",
    )


def agents_arg(text: str) -> tuple[str, ...]:
    """``HOST:PORT[,HOST:PORT...]``, each once (argparse's usage error for anything else)."""
    return tuple(f"{host}:{port}" for host, port in endpoints_arg(text))


def page_address(args: argparse.Namespace) -> str | None:
    """``--status`` as ``HOST:PORT``, its default port filled in (``None``: not given)."""
    if args.status is None:
        return None
    host, port = args.status
    return f"{host}:{STATUS_PORT if port is None else port}"


def agents_flags(args: argparse.Namespace) -> tuple[str, ...]:
    """``--status-agents`` as ``meta serve`` takes it (none if none are named)."""
    return ("--status-agents", ",".join(args.status_agents)) if args.status_agents else ()


async def status_page(
    service: MetaService, args: argparse.Namespace, secret: bytes, said: list[str]
) -> Callable[[], Awaitable[None]]:
    """Start ``service``'s status page if ``--status`` asks for one (the service closed if it
    cannot), its address added to ``said``; what closes the page and the service."""
    if args.status is None:
        return service.close
    from ..meta import StatusPage

    page = StatusPage(service, secret=secret, agents=args.status_agents)
    host, port = args.status
    try:
        where = await page.start(host, STATUS_PORT if port is None else port)
    except BaseException:
        await service.close()
        raise
    said.append(f"status page at http://{where}/")

    async def close() -> None:
        await page.close()
        await service.close()

    return close


def add_cluster_token(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``graben token cluster``."""
    shown = actions.add_parser(
        "cluster",
        help="Print the cluster's own token (the operator's, from the secret): for the "
        "status page, or $GRABEN_TOKEN.",
    )
    shown.add_argument(
        "--secret-file",
        type=Path,
        default=None,
        help="file holding the cluster secret (default: $GRABEN_SECRET, $GRABEN_SECRET_FILE)",
    )
    shown.set_defaults(run=_cluster_token)


def _cluster_token(args: argparse.Namespace) -> int:
    print(auth.client_token(auth.load_secret(args.secret_file)))
    return 0
