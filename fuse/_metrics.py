"""The mount daemon's Prometheus metrics (``graben mount --metrics HOST:PORT``).

Every FUSE request the daemon answers is counted by op and outcome (``ok``
or the errno's name; a lookup answered with a negative entry is ``ENOENT``)
and timed; reads and writes add their bytes. The rest is read when scraped,
from the state the mount keeps anyway: the spool's bytes and limit, files and
handles open, and the read-ahead's hits (a kernel read answered from a block
already fetched or in flight) and misses.

The names follow the servers' (``graben_requests_total``,
``graben_request_seconds``), with ``graben_mount_`` for the mount's own. As
there, the registry is this mount's alone, served by the servers' own
``graben.store.serve_metrics``, and prometheus_client is imported only when
metrics are asked for.
"""

from __future__ import annotations

import errno
import functools
import inspect
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any

import pyfuse3

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Counter, Histogram
    from prometheus_client.metrics_core import Metric

    from ._base import Base

LATENCY_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10)
"""Seconds: a cached getattr takes microseconds, a close that commits a big file seconds."""
BYTES_OF: dict[str, Callable[[Any], int]] = {"read": len, "write": int}
"""Ops that move data, and how many bytes a call moved, from its result (``read``: the
bytes; ``write``: their count)."""


class MountMetrics:
    """One mount's metrics, in a registry of its own (``registry``)."""

    def __init__(self, ops: Base) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry: CollectorRegistry = CollectorRegistry()
        self._requests: Counter = Counter(
            "graben_requests",
            "FUSE requests answered, by op and outcome (ok, or the errno's name)",
            ("op", "outcome"),
            registry=self.registry,
        )
        self._latency: Histogram = Histogram(
            "graben_request_seconds",
            "Seconds the daemon took to answer a FUSE request",
            ("op",),
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        # Named as the servers' bytes: what a request brought (a write's data)
        # and what its reply took back (a read's), so ``graben stats`` reads both.
        received = Counter(
            "graben_request_bytes",
            "Bytes written through the mount",
            ("op",),
            registry=self.registry,
        )
        sent = Counter(
            "graben_response_bytes", "Bytes read through the mount", ("op",), registry=self.registry
        )
        self._bytes: dict[str, Counter] = {"write": received, "read": sent}
        self.registry.register(_State(ops))

    def instrument(self, ops: Base) -> None:
        """Count and time every FUSE request ``ops`` answers from now on."""
        for name, handler in inspect.getmembers(ops, inspect.iscoroutinefunction):
            if hasattr(pyfuse3.Operations, name) and not name.startswith("_"):
                setattr(ops, name, self._observed(name, handler))

    def _observed(
        self, op: str, handler: Callable[..., Coroutine[Any, Any, Any]]
    ) -> Callable[..., Coroutine[Any, Any, Any]]:
        moved = BYTES_OF.get(op)

        @functools.wraps(handler)
        async def observed(*args: Any, **kwargs: Any) -> Any:
            start, outcome = time.perf_counter(), "ok"
            try:
                result = await handler(*args, **kwargs)
                if isinstance(result, pyfuse3.EntryAttributes) and result.st_ino == 0:
                    outcome = "ENOENT"  # a negative entry: the name is not there
            except pyfuse3.FUSEError as exc:
                outcome = errno.errorcode.get(exc.errno, str(exc.errno))
                raise
            finally:
                self._requests.labels(op, outcome).inc()
                self._latency.labels(op).observe(time.perf_counter() - start)
            if moved is not None:
                self._bytes[op].labels(op).inc(moved(result))
            return result

        return observed


class _State:
    """The gauges and counters read off the mount's state at each scrape."""

    def __init__(self, ops: Base) -> None:
        self._ops = ops

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        ops, ahead = self._ops, self._ops.read_ahead
        yield GaugeMetricFamily(
            "graben_mount_spool_bytes", "Bytes staged in the spool", value=ops.spool.used
        )
        yield GaugeMetricFamily(
            "graben_mount_spool_limit_bytes",
            "Bytes the spool may hold (--spool-limit)",
            value=ops.spool.limit,
        )
        yield GaugeMetricFamily("graben_mount_open_files", "Files open", value=ops.open_files)
        yield GaugeMetricFamily("graben_mount_handles", "Open handles", value=ops.open_handles)
        yield CounterMetricFamily(
            "graben_mount_change_groups",
            "Calls sending queued unlinks or attribute changes, a group each (_queue)",
            value=ops.queue.groups,
        )
        yield CounterMetricFamily(
            "graben_mount_read_ahead_hits",
            "Kernel reads answered from a block fetched ahead (or being fetched)",
            value=ahead.hits,
        )
        yield CounterMetricFamily(
            "graben_mount_read_ahead_misses",
            "Kernel reads that had to start fetching their block",
            value=ahead.misses,
        )
