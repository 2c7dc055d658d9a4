"""``graben stats HOST:PORT ...``: a live view of servers' metrics, as ``juicefs stats``.

Reads each server's ``/metrics`` (``--metrics`` on ``meta serve``, ``node serve``
and ``mount``) every ``--interval`` seconds and shows, per server and op,
the rates since the last read: requests and errors per second, mean
latency, bytes in and out per second; then the gauges (chunks short of
copies, the repair queue, free bytes, a mount's spool and open files).
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

from rich.console import Console
from rich.live import Live
from rich.table import Table

from .._errors import ProtocolError, Unavailable
from ._listen import address_arg
from ._render import human_size

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
        "servers", nargs="+", type=address_arg, metavar="HOST:PORT", help="their --metrics"
    )
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
    servers: list[tuple[str, int]] = args.servers
    before = [scrape(*s) for s in servers]
    console = Console()
    if args.once:
        time.sleep(args.interval)
        console.print(table(servers, before, [scrape(*s) for s in servers], args.interval))
        return 0
    with contextlib.suppress(KeyboardInterrupt), Live(console=console) as live:
        while True:
            time.sleep(args.interval)
            after = [scrape(*s) for s in servers]
            live.update(table(servers, before, after, args.interval))
            before = after
    return 0


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


def table(
    servers: list[tuple[str, int]], before: list[Samples], after: list[Samples], s: float
) -> Table:
    """Rates between two reads ``s`` seconds apart, per server and op; then the gauges."""
    out = Table("server", "op", "req/s", "err/s", "mean ms", "in/s", "out/s")
    for (host, port), old, new in zip(servers, before, after, strict=True):
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
                f"{host}:{port}",
                op,
                f"{n / s:.1f}",
                f"{(errors[1].get(op, 0) - errors[0].get(op, 0)) / s:.1f}",
                f"{mean:.2f}",
                human_size(int((received[1].get(op, 0) - received[0].get(op, 0)) / s)),
                human_size(int((sent[1].get(op, 0) - sent[0].get(op, 0)) / s)),
            )
        gauges = [
            f"{name.removeprefix('graben_')} "
            f"{human_size(int(v)) if name.endswith('bytes') else int(v)}"
            for name in GAUGES
            if (v := new.get((name, "", ""))) is not None
        ]
        if gauges:
            out.add_row(f"{host}:{port}", "; ".join(gauges), "", "", "", "", "")
    return out
