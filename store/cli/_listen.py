"""Where the servers listen and what they tell others to dial.

Default ports: the metadata service 7100; a data node the first free one from
7200 upward on its ``--listen`` host (so several nodes on one host need no
ports). ``--listen HOST:0`` takes any free port. ``--advertise`` is the
address the others are told (a node's heartbeats carry it); a wildcard
``--listen`` needs one. ``--metrics`` is where a server serves its Prometheus metrics:
on by default, beside its own port (``metrics_at``).
"""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING, Any

from .._config import ENV_METRICS, env, parse_size
from .._errors import InvalidArgument, Unavailable
from ..wire import BESIDE, METRICS_OFFSET, WILDCARDS

if TYPE_CHECKING:
    from ..node import DataNode

META_PORT = 7100
NODE_PORT = 7200
NODE_PORTS = 100
"""Ports a data node given no port tries, from ``NODE_PORT`` upward."""
OFF = "off"
"""``--metrics off``: no metrics served."""


def address_arg(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host, int(port)


def endpoints_arg(text: str) -> tuple[tuple[str, int], ...]:
    """``HOST:PORT[,HOST:PORT...]``: every metadata service a server may talk to."""
    return tuple(dict.fromkeys(address_arg(item.strip()) for item in text.split(",")))


def endpoint(text: str) -> tuple[str, int | None]:
    """``HOST:PORT`` or ``HOST`` alone (the server's default port)."""
    if ":" not in text:
        if not text:
            raise argparse.ArgumentTypeError("an empty address")
        return text, None
    return address_arg(text)


def listen_args(parser: argparse.ArgumentParser, default: str, what: str) -> None:
    parser.add_argument(
        "--listen",
        type=endpoint,
        default=default,
        help=f"HOST[:PORT] to bind ({what}; PORT 0: any free port)",
    )
    parser.add_argument(
        "--advertise",
        type=endpoint,
        default=None,
        help="HOST[:PORT] others are told to dial (default: --listen's; required when "
        "--listen is a wildcard such as 0.0.0.0; PORT defaults to the bound one)",
    )


def metrics_arg(parser: argparse.ArgumentParser, where: str = "") -> None:
    """``--metrics HOST:PORT`` or ``off``; ``where`` says where they are without it
    (default: a server's, ``metrics_at``)."""
    parser.add_argument(
        "--metrics",
        type=metrics_value,
        default=None,
        metavar="HOST:PORT|off",
        help="serve Prometheus metrics at http://HOST:PORT/metrics, or none ('off'); "
        + (
            where
            or f"default: --listen's host, its port + {METRICS_OFFSET} (7100: 8100); "
            "any free port if --listen's is 0"
        ),
    )


def metrics_value(text: str) -> tuple[str, int] | str:
    """``--metrics``' value: ``HOST:PORT``, or ``OFF``."""
    return OFF if text.strip().lower() in ("off", "none", "no") else address_arg(text)


def metrics_at(
    given: tuple[str, int] | str | None, listen: tuple[str, int | None]
) -> tuple[str, int] | None:
    """Where a server serves its metrics: ``--metrics``' address (not given:
    ``$GRABEN_METRICS``'); ``None`` for ``off``; by default on ``--listen``'s host beside
    the server's port (``BESIDE``), or any free port if it listens on any free port."""
    if given is None and (told := env(ENV_METRICS)):
        try:
            given = metrics_value(told)
        except argparse.ArgumentTypeError as exc:
            raise InvalidArgument(f"${ENV_METRICS}: {exc}") from None
    if isinstance(given, str):  # OFF
        return None
    if given is not None:
        return given
    return listen[0], 0 if listen[1] == 0 else BESIDE


def check_advertise(listen: tuple[str, int | None], advertise: object) -> None:
    """Refuse, before binding, a wildcard address nobody could dial."""
    if listen[0] in WILDCARDS and advertise is None:
        raise InvalidArgument(
            f"--listen {listen[0]} binds every interface, but others need an address "
            "to dial: give --advertise HOST[:PORT] too"
        )


def advertised(listen: tuple[str, int | None], port: int, advertise: Any) -> str:
    """The address others dial: ``--advertise``'s (its port defaulting to the bound
    one), else the bound host and port."""
    if advertise is None:
        return f"{listen[0]}:{port}"
    host, advertised_port = advertise
    return f"{host}:{port if advertised_port is None else advertised_port}"


def advertise_address(advertise: tuple[str, int | None] | None) -> str | None:
    """``--advertise`` as the node takes it: ``HOST`` alone means its bound port."""
    if advertise is None:
        return None
    host, port = advertise
    return host if port is None else f"{host}:{port}"


async def start_node(node: DataNode, listen: tuple[str, int | None], advertise: Any) -> None:
    """Start ``node`` on ``listen``'s port, else on the first free one from ``NODE_PORT``."""
    host, port = listen
    node.serve_metrics()  # before the loop: a metrics port taken is no reason to try another
    ports = range(NODE_PORT, NODE_PORT + NODE_PORTS) if port is None else (port,)
    for p in ports:
        try:
            await node.start(host, p, advertise=advertise_address(advertise))
            return
        except Unavailable:
            if port is not None:
                raise
    raise Unavailable(
        f"no free port from {NODE_PORT} to {NODE_PORT + NODE_PORTS - 1} on {host}; "
        "give --listen HOST:PORT"
    )


_COUNT_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def count_arg(text: str) -> int:
    """A count as people write it (``10000000``, ``10_000``, ``10M``, ``1.5k``: thousands,
    not KiB), or argparse's usage error."""
    found = re.fullmatch(r"\s*([0-9][0-9_]*(?:\.[0-9]+)?)\s*([kKmMgGtT]?)\s*", text)
    if found is not None:
        value = float(found.group(1).replace("_", "")) * _COUNT_UNITS[found.group(2).lower()]
        if value == int(value):
            return int(value)
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a count: a whole number, or with k, M, G or T (10M)"
    )


def size_arg(text: str) -> int:
    """An argument's bytes as people write them (``10G``), or argparse's usage error."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
