"""``graben stats [HOST:PORT ...]``: a live view of servers' metrics, as ``juicefs stats``.

Reads each server's ``/metrics`` every ``--interval`` seconds: those given
(``--metrics`` of ``meta serve``, ``node serve``, ``agent serve`` and ``mount``),
else those of every metadata service and live data node of the cluster at
``--store`` (default ``$GRABEN_URL``), which each records where it serves them
(they do by default). It shows, per server and op,
the rates since the last read: requests and errors per second, mean
latency, bytes in and out per second; then the gauges (chunks short of
copies, the repair queue, free bytes, a mount's spool and open files). Each
server is a table of its own, titled with its name, so the view fits a
terminal of 80 columns.
``--once`` prints one table, over one interval, and exits (for scripts and
tests); otherwise it redraws until Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import time
import urllib.error
import urllib.request
from collections import defaultdict
from typing import TYPE_CHECKING, TypeAlias

from rich.console import Console, Group
from rich.live import Live
from rich.table import Column, Table

from .._config import human_size
from .._errors import InvalidArgument, ProtocolError, Unavailable
from ._listen import address_arg
from ._tls import tls_arg

if TYPE_CHECKING:
    from ._cluster import Subparsers

Samples: TypeAlias = dict[tuple[str, str, str], float]
"""A server's samples by (name, op label, outcome label)."""
GAUGES = (
    "graben_chunks_short",
    "graben_repair_queue",
    "graben_free_bytes",
    "graben_mount_spool_bytes",
    "graben_mount_open_files",
)
SCRAPE_TIMEOUT_S = 5.0


def add_stats(sub: Subparsers) -> None:
    """``graben stats``."""
    stats = sub.add_parser("stats", help="Show servers' request rates and gauges, live.")
    stats.add_argument(
        "servers",
        nargs="*",
        type=address_arg,
        metavar="HOST:PORT",
        help="their --metrics (default: every server of the cluster at --store)",
    )
    stats.add_argument("--store", default=None, help="the cluster's URL (default: $GRABEN_URL)")
    tls_arg(stats)
    stats.add_argument("--interval", type=_seconds, default=1.0, help="seconds between reads")
    stats.add_argument("--once", action="store_true", help="print one table and exit")
    stats.set_defaults(run=_stats)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def _stats(args: argparse.Namespace) -> int:
    servers = [(f"{h}:{p}", (h, p)) for h, p in args.servers] or _cluster_servers(args)
    before = [scrape(*at) for _, at in servers]
    console = Console()
    if args.once:
        time.sleep(args.interval)
        after = [scrape(*at) for _, at in servers]
        console.print(view([name for name, _ in servers], before, after, args.interval))
        return 0
    with contextlib.suppress(KeyboardInterrupt), Live(console=console) as live:
        while True:
            time.sleep(args.interval)
            after = [scrape(*at) for _, at in servers]
            live.update(view([name for name, _ in servers], before, after, args.interval))
            before = after
    return 0


def _cluster_servers(args: argparse.Namespace) -> list[tuple[str, tuple[str, int]]]:
    """Each metadata service's and live data node's name and metrics address, as the
    cluster at ``--store`` records them."""
    from .._config import resolve
    from ._stores import open_client

    if resolve(args.store).address is None:
        raise InvalidArgument(
            "name the servers (HOST:PORT of their metrics), or a cluster's URL: --store "
            "graben://HOST:PORT or $GRABEN_URL (an embedded store has no servers)"
        )
    with open_client(args.store, args) as client:
        health = client.health()
    found = [(f"meta {s.address}", s.metrics) for s in health.services if s.alive]
    found += [(f"node {n.address}", n.metrics) for n in health.nodes if n.alive]
    servers = [(name, address_arg(at)) for name, at in found if at]
    if not servers:
        raise Unavailable(
            "no server of the cluster serves metrics (they do unless started with --metrics off)"
        )
    return servers


def scrape(host: str, port: int) -> Samples:
    """The samples of ``http://host:port/metrics``; ``Unavailable`` if it cannot be read."""
    from prometheus_client.parser import text_string_to_metric_families

    url = f"http://{host}:{port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as reply:
            text = reply.read().decode()
    except (OSError, urllib.error.URLError) as exc:
        why = getattr(exc, "reason", None) or exc
        raise Unavailable(f"cannot read metrics from {url}: {why}") from None
    samples: Samples = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                key = (s.name, s.labels.get("op", ""), s.labels.get("outcome", ""))
                samples[key] = s.value
    except ValueError as exc:
        raise ProtocolError(f"{url} does not serve Prometheus metrics: {exc}") from None
    return samples


def _sums(samples: Samples, name: str) -> dict[str, float]:
    """``name``'s values summed by op (over outcomes)."""
    sums: dict[str, float] = defaultdict(float)
    for (n, op, _), value in samples.items():
        if n == name:
            sums[op] += value
    return sums


def _errors(samples: Samples) -> dict[str, float]:
    sums: dict[str, float] = defaultdict(float)
    for (n, op, outcome), value in samples.items():
        if n == "graben_requests_total" and outcome != "ok":
            sums[op] += value
    return sums


def view(names: list[str], before: list[Samples], after: list[Samples], s: float) -> Group:
    """Rates between two reads ``s`` seconds apart: a table per server, titled with its
    name, a row per op; then its gauges."""
    return Group(*(table(*server, s) for server in zip(names, before, after, strict=True)))


def table(name: str, old: Samples, new: Samples, s: float) -> Table:
    """One server's rates by op between two reads ``s`` seconds apart; its gauges below."""
    gauges = [
        f"{gauge.removeprefix('graben_')} "
        f"{human_size(int(v)) if gauge.endswith('bytes') else int(v)}"
        for gauge in GAUGES
        if (v := new.get((gauge, "", ""))) is not None
    ]
    out = Table(
        "op",
        *(Column(h, justify="right") for h in ("req/s", "err/s", "mean ms", "in/s", "out/s")),
        title=name,
        title_justify="left",
        caption="; ".join(gauges) or None,
        caption_justify="left",
    )
    counts = [_sums(x, "graben_requests_total") for x in (old, new)]
    errors = [_errors(x) for x in (old, new)]
    seconds = [_sums(x, "graben_request_seconds_sum") for x in (old, new)]
    received = [_sums(x, "graben_request_bytes_total") for x in (old, new)]
    sent = [_sums(x, "graben_response_bytes_total") for x in (old, new)]
    for op in sorted(counts[1]):
        n = counts[1][op] - counts[0].get(op, 0)
        if n <= 0:
            continue
        mean = (seconds[1].get(op, 0) - seconds[0].get(op, 0)) / n * 1000
        out.add_row(
            op,
            f"{n / s:.1f}",
            f"{(errors[1].get(op, 0) - errors[0].get(op, 0)) / s:.1f}",
            f"{mean:.2f}",
            human_size(int((received[1].get(op, 0) - received[0].get(op, 0)) / s)),
            human_size(int((sent[1].get(op, 0) - sent[0].get(op, 0)) / s)),
        )
    if not out.row_count:
        out.add_row("(no requests)", *[""] * 5)
    return out
