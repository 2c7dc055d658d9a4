"""A server's Prometheus metrics, served over HTTP at ``/metrics`` (``--metrics HOST:PORT``).

Each server has a registry of its own (never prometheus_client's global one),
so several servers in one process (tests, the embedded store) never mix
their numbers. ``Server.answer`` records every request: a count by op and
outcome, a latency histogram by op, and the bytes received and sent with
it. The metadata service and the data nodes add their own gauges and
counters to the same registry.

The HTTP server runs on a thread of prometheus_client's own: a scrape
never waits for the event loop, and a busy loop never delays a scrape.
``serve_metrics`` is that server for any registry: the mount daemon serves
its own with it too (``graben.store`` exports it for the doors).
prometheus_client is imported only when a server asks for metrics: clients
import this package too, and need not pay for it.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from .._errors import Unavailable

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Counter, Gauge

METRICS_OFFSET = 1000
"""Unless told otherwise, a server serves its metrics on its own port + this: the
metadata service's 7100 on 8100, a data node's 7200 on 8200, a memory agent's 7300 on
8300 (``graben ... serve --metrics off`` serves none)."""
BESIDE = -1
"""The port of ``metrics=(HOST, BESIDE)``: the server's own port + ``METRICS_OFFSET``,
else (that port taken) any free one, and the log says which."""
WILDCARDS = frozenset({"", "0.0.0.0", "::", "*"})
"""Hosts that bind every interface: nobody dials them."""

log = logging.getLogger("graben.metrics")
STOP_POLL_S = 0.05
"""How often the metrics server's thread looks whether it is to stop."""
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
"""Seconds: metadata requests take well under a millisecond, a chunk write some tens."""


class Metrics:
    """One server's metrics (see the module docstring)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Histogram

        self.registry = CollectorRegistry()
        self._requests = self.counter(
            "graben_requests",
            "Requests served, by op and outcome (ok, or the error's wire code)",
            ("op", "outcome"),
        )
        self._latency = Histogram(
            "graben_request_seconds",
            "Seconds from a request's arrival (its payload received) to its reply",
            ("op",),
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._received = self.counter(
            "graben_request_bytes", "Bytes of request bodies and payloads received", ("op",)
        )
        self._sent = self.counter(
            "graben_response_bytes", "Bytes of reply bodies and payloads sent", ("op",)
        )
        self._stop: Callable[[], None] | None = None
        self.address = ""
        """``HOST:PORT`` ``/metrics`` is served at; ``""``: not served."""

    def counter(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
        """A counter in this server's registry (``_total`` is added to ``name``)."""
        from prometheus_client import Counter

        return Counter(name, doc, labels, registry=self.registry)

    def gauge(self, name: str, doc: str) -> Gauge:
        """A gauge in this server's registry."""
        from prometheus_client import Gauge

        return Gauge(name, doc, registry=self.registry)

    def observe(self, op: str, outcome: str, seconds: float, received: int, sent: int) -> None:
        """Record one request answered."""
        self._requests.labels(op, outcome).inc()
        self._latency.labels(op).observe(seconds)
        self._received.labels(op).inc(received)
        self._sent.labels(op).inc(sent)

    def serve(self, host: str, port: int, server_port: int | None = None) -> str:
        """Serve ``/metrics`` on ``host:port`` until ``close``; the address bound (``""``
        until it is served).

        ``port`` ``BESIDE`` waits for the server's own port (``server_port``; ``None``:
        not bound yet), then serves on it + ``METRICS_OFFSET``, else (taken) on any free
        one. Called again once serving, it changes nothing."""
        if self._stop is not None or (port == BESIDE and server_port is None):
            return self.address
        if port != BESIDE:
            self.address, self._stop = serve_metrics(self.registry, host, port)
            return self.address
        assert server_port is not None
        try:
            return self.serve(host, server_port + METRICS_OFFSET)
        except Unavailable as exc:
            self.serve(host, 0)
            log.warning("%s; metrics at http://%s/metrics instead", exc.message, self.address)
            return self.address

    def close(self) -> None:
        """Stop serving ``/metrics`` (a scrape in flight finishes first)."""
        stop, self._stop, self.address = self._stop, None, ""
        if stop is not None:
            stop()


def serve_if_asked(
    metrics: Metrics | None, at: tuple[str, int] | None, server_port: int | None = None
) -> str:
    """Serve ``metrics`` at ``at`` if both are given and it is not served yet (see
    ``Metrics.serve``); where it is served (``""``: nowhere yet)."""
    if metrics is None or at is None:
        return ""
    if not metrics.address and (where := metrics.serve(*at, server_port)):
        log.info("metrics at http://%s/metrics", where)
    return metrics.address


def serve_metrics(
    registry: CollectorRegistry, host: str, port: int
) -> tuple[str, Callable[[], None]]:
    """Serve ``registry`` over HTTP at ``/metrics`` on ``host:port`` (port 0: any free one).

    Returns the address bound and the function that stops serving (a scrape
    in flight finishes first). A port that cannot be had is ``Unavailable``.
    prometheus_client's own ``start_http_server`` polls for its stop every
    0.5 s, which every server's stop waited out; this one's thread looks every
    ``STOP_POLL_S``.
    """
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from prometheus_client import make_wsgi_app
    from prometheus_client.exposition import ThreadingWSGIServer

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass  # a scrape is no event

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    try:
        server = make_server(host, port, make_wsgi_app(registry), Server, handler_class=Quiet)
    except OSError as exc:
        raise Unavailable(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from None
    thread = threading.Thread(
        target=server.serve_forever, args=(STOP_POLL_S,), name="metrics", daemon=True
    )
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join()

    return f"{host}:{server.server_port}", stop


def dialled(bound: str, advertised: str) -> str:
    """The address others dial for metrics bound at ``bound`` (``HOST:PORT``): the same,
    unless it binds every interface; then the host the server advertises."""
    host, _, port = bound.rpartition(":")
    if host.strip("[]") in WILDCARDS:
        host = advertised.rpartition(":")[0] if ":" in advertised else advertised
    return f"{host}:{port}"
