"""A local cluster whose processes a test can kill: metadata service(s) + N data nodes;
and what tests ask of any cluster: copies of a file's chunks, live nodes, metrics."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from graben.store import TLS, Client
from graben.store.cli._local import _spawn, _stop, _wait_for_nodes, local_cluster
from graben.store.client import _loop
from graben.store.transport._requests import GetLayout, ListNodes


class LocalCluster:
    """Real server processes on loopback; ``kill(i)`` sends SIGKILL to data node ``i``.

    ``metas`` metadata services share the one engine; the URL names them all, in
    order, and the nodes heartbeat to whichever of them answers."""

    def __init__(
        self,
        root: Path,
        nodes: int,
        *,
        replication: int = 3,
        timeout: float = 10.0,
        repair: float = 5.0,
        scrub: float = 3600.0,
        meta_args: tuple[str, ...] = (),
        node_args: tuple[str, ...] = (),
        node_args_of: Callable[[int], tuple[str, ...]] = lambda i: (),
        engine: str | None = None,
        metas: int = 1,
        nodes_meta_first: int = 0,
        tls: TLS | None = None,
    ):
        self.root, self.scrub, self._node_args = root, scrub, node_args
        self.tls = tls
        """What this kit's own client uses to see the nodes report (servers take their TLS
        flags in ``meta_args`` and ``node_args``)."""
        self._node_args_of = node_args_of
        """Flags for node ``i`` alone (its own ``--metrics`` port, say)."""
        self._nodes_meta_first = nodes_meta_first
        """The metadata service the nodes' ``--meta`` names first (they heartbeat to it
        while it answers); the others follow in order."""
        self._started = time.time()
        self._meta_options = (
            *("--replication", str(replication)),
            *("--heartbeat-timeout", str(timeout), "--repair-interval", str(repair)),
            *meta_args,
        )
        self.engine = engine or f"sqlite:///{root / 'meta.db'}"
        """The metadata service's ``--engine`` (default: SQLite in ``root``)."""
        self.metas: list[subprocess.Popen[str]] = []
        self.meta_addresses: list[str] = []
        self.nodes: list[subprocess.Popen[str]] = []
        self.addresses: list[str] = []
        try:
            for _ in range(metas):
                proc, address = _spawn(*self._meta_args(self.engine))
                self.metas.append(proc)
                self.meta_addresses.append(address)
            self.meta, self.meta_address = self.metas[0], self.meta_addresses[0]
            self.url = f"graben://{','.join(self.meta_addresses)}"
            for i in range(nodes):
                self.start_node(i)
            self.wait_alive(nodes)
        except BaseException:
            self.close()  # never leave half a cluster running
            raise

    def _meta_args(self, engine: Path | str) -> tuple[str, ...]:
        # --init: a new store the first time, the same one after.
        url = engine if isinstance(engine, str) else f"sqlite:///{engine}"
        return (
            *("meta", "serve", "--init", "--engine", url),
            *("--listen", "127.0.0.1:0", *self._meta_options),
        )

    def restart_meta(
        self, *, down_s: float = 0.0, engine: Path | None = None, repair: float | None = None
    ) -> None:
        """SIGKILL the metadata service and start it again on the same port (and engine,
        unless another is given; repairing every ``repair`` seconds, if given)."""
        self.meta.send_signal(signal.SIGKILL)
        self.meta.wait()
        if self.meta.stdout is not None:
            self.meta.stdout.close()
        time.sleep(down_s)
        args = self._meta_args(engine or self.engine)
        again = () if repair is None else ("--repair-interval", str(repair))
        self.meta, _ = _spawn(*args, *again, "--listen", self.meta_address)
        self.metas[0] = self.meta

    def kill_meta(self, i: int) -> None:
        """SIGKILL metadata service ``i``."""
        self.metas[i].send_signal(signal.SIGKILL)
        self.metas[i].wait()
        if self.metas[i].stdout is not None:
            self.metas[i].stdout.close()

    def start_node(self, i: int, *, meta: str | None = None) -> None:
        """Start data node ``i`` (again), heartbeating to ``meta`` (default: this cluster's)."""
        proc, address = _spawn(
            *("node", "serve", "--data", str(self.root / f"node{i}")),
            *("--meta", meta or self._nodes_meta()),
            *("--rack", f"rack{i}"),
            *("--listen", "127.0.0.1:0"),
            *("--scrub-interval", str(self.scrub)),
            *self._node_args,
            *self._node_args_of(i),
        )
        if i < len(self.nodes):
            self.nodes[i], self.addresses[i] = proc, address
        else:
            self.nodes.append(proc)
            self.addresses.append(address)

    def _nodes_meta(self) -> str:
        first = self._nodes_meta_first
        return ",".join(self.meta_addresses[first:] + self.meta_addresses[:first])

    def node_dir(self, i: int) -> Path:
        return self.root / f"node{i}"

    def chunk_files(self, i: int) -> list[Path]:
        return sorted(p for p in (self.node_dir(i) / "chunks").glob("??/??/*") if p.is_file())

    def kill(self, i: int) -> None:
        self.nodes[i].send_signal(signal.SIGKILL)
        self.nodes[i].wait()
        if self.nodes[i].stdout is not None:
            self.nodes[i].stdout.close()

    def wait_alive(self, count: int) -> None:
        _wait_for_nodes(self.url, count, since=self._started, tls=self.tls)

    def close(self) -> None:
        _stop([*self.metas, *self.nodes])


@contextlib.contextmanager
def three_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``graben cluster up`` with 3 data nodes on loopback, on the session's secret; its URL."""
    secret = Path(os.environ["GRABEN_SECRET_FILE"])
    with local_cluster(tmp_path_factory.mktemp("cluster"), nodes=3, secret_file=secret) as url:
        yield url


def copies(client: Client, path: str) -> list[int]:
    """Copies of each chunk of ``path`` on nodes the metadata service thinks alive."""
    layout = _loop.run(client.aio.meta.request(GetLayout(path)))
    live = {n.id for n in _loop.run(client.aio.meta.request(ListNodes())) if n.alive}
    return [len(set(layout.replicas[x.chunk.id]) & live) for x in layout.extents]


def alive(client: Client) -> int:
    """Data nodes the metadata service thinks alive."""
    return sum(n.alive for n in _loop.run(client.aio.meta.request(ListNodes())))


def eventually(check: Callable[[], bool], seconds: float = 30.0) -> float:
    """Seconds until ``check`` held (polled every 0.2 s); fails after ``seconds``."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < seconds, "did not happen in time"
        time.sleep(0.2)
    return time.monotonic() - started


def scrape(port: int) -> dict[str, float]:
    """``/metrics`` at 127.0.0.1:``port``: each sample line's value by its name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        assert reply.status == 200
        text = reply.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def sum_of(samples: dict[str, float], pattern: str) -> float:
    """The sum of the samples whose name and labels match ``pattern`` whole."""
    return sum(v for k, v in samples.items() if re.fullmatch(pattern, k))
