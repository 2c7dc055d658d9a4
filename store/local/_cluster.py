"""A cluster on this machine: metadata services and data nodes, each a child process
(``LocalCluster``); ``graben cluster up`` itself in a child process (``cluster_up``);
whether the cluster in a root is new (``is_new_store``)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType

from .._config import TLS
from .._errors import IntegrityError, InvalidArgument, Unavailable
from ..wire import auth
from ._processes import kill, spawn, stop, wait_for_nodes
from ._restarts import Backoff, exit_words

Say = Callable[[str], None]
"""Where ``tend`` says what died and what it restarted: one line each."""


def _no_args(i: int) -> tuple[str, ...]:
    return ()


class LocalCluster:
    """Metadata services and data nodes on loopback, each a ``graben`` child process,
    which a caller may kill and start again. What ``graben cluster up`` runs.

    Call order: the constructor starts every server and returns once every data node
    has heartbeated (on any failure, Ctrl-C too, it stops what it started); then any
    of ``start_node``, ``kill``, ``kill_meta``, ``restart_meta``, ``wait_alive``; last
    ``close`` (or use it in a ``with`` block). ``tend``, called often (``graben cluster
    up`` does, several times a second), restarts the servers found dead.

    ``metas`` metadata services share the one engine; ``url`` names them all, in
    order, and the nodes heartbeat to whichever of them answers. Node ``i`` keeps its
    data in ``root/node<i>`` and is alone in its rack, ``rack<i>``.
    """

    def __init__(
        self,
        root: Path,
        nodes: int,
        *,
        metas: int = 1,
        engine: str | None = None,
        init: bool = True,
        replication: int | None = None,
        heartbeat_timeout: float = 10.0,
        port: int = 0,
        node_port: int | None = 0,
        metrics: tuple[str, int] | str | None = None,
        secret_file: Path | None = None,
        meta_args: tuple[str, ...] = (),
        node_args: tuple[str, ...] = (),
        node_args_of: Callable[[int], tuple[str, ...]] = _no_args,
        nodes_meta_first: int = 0,
        tls: TLS | None = None,
        status: str | None = None,
    ) -> None:
        """``engine``: the metadata's (default: SQLite in ``root/meta.db``); ``init``: the
        first service makes the store if its engine holds none (``meta serve --init``).
        ``replication`` (default ``min(3, nodes)``) and ``heartbeat_timeout``: the
        services'. ``port``: service ``j`` listens on ``port + j``; ``node_port``: node
        ``i`` on ``node_port + i`` (0: any free ports; ``node_port=None``: the first free
        from the nodes' default). ``metrics``: ``(host, port)`` of every server's
        ``/metrics``: service 0 on ``port``, node ``i`` on ``port + 1 + i``, the other
        services after the nodes (port 0: any free ports); ``"off"``: none; ``None``:
        the servers' default (each beside its own port, any free one beside port 0).
        ``secret_file``: every server's ``--secret-file``, and whose token this kit shows
        (default: the environment's). ``meta_args``, ``node_args``: more flags for every service,
        every node; ``node_args_of(i)``: for node ``i`` alone. ``nodes_meta_first``: the
        service the nodes' ``--meta`` names first (they heartbeat to it while it
        answers). ``tls``: what this kit's own client uses to see the nodes report
        (the servers take their TLS flags in ``meta_args`` and ``node_args``).
        ``status``: ``HOST:PORT`` of the first service's status page (``--status``; port
        0: any free one, kept when it is started again): ``status_address``."""
        if nodes < 1:
            raise InvalidArgument("a cluster needs at least one data node")
        if metas < 1:
            raise InvalidArgument("a cluster needs at least one metadata service")
        self.root, self.init, self.tls = root, init, tls
        self.engine = engine or f"sqlite:///{root.resolve() / 'meta.db'}"
        """The metadata services' ``--engine``."""
        self.replication = replication or min(3, nodes)
        """The services' default replication."""
        self._count, self._port, self._node_port = nodes, port, node_port
        self._metrics, self._nodes_meta_first = metrics, nodes_meta_first
        secret = () if secret_file is None else ("--secret-file", str(secret_file))
        self._token = None if secret_file is None else _token(secret_file)
        self._meta_args = (
            *("--replication", str(self.replication)),
            *("--heartbeat-timeout", str(heartbeat_timeout)),
        )
        self._meta_tail, self._node_tail = (*secret, *meta_args), (*secret, *node_args)
        self._node_args_of = node_args_of
        self._started = time.time()
        self._backoffs: dict[tuple[str, int], Backoff] = {}
        """(role, index) -> that server's restarts, once ``tend`` has seen it."""
        self._status = status
        self.status_address = ""
        """``HOST:PORT`` of the first service's status page (``""``: none)."""
        self.metas: list[subprocess.Popen[str]] = []
        self.meta_addresses: list[str] = []
        """Each metadata service's address, in order."""
        self.nodes: list[subprocess.Popen[str]] = []
        self.addresses: list[str] = []
        """Each data node's address, in order."""
        try:
            for j in range(metas):
                proc, address = spawn(*self._meta_argv(j, self.engine))
                if j == 0 and status is not None:  # its second line: where the page is
                    said = proc.stdout.readline() if proc.stdout is not None else ""
                    self._status = self.status_address = said.split("//")[-1].strip(" /\n")
                self.metas.append(proc)
                self.meta_addresses.append(address)
            for i in range(nodes):
                self.start_node(i)
            self.wait_alive(nodes)
        except BaseException:
            self.close()  # never leave half a cluster running
            raise

    @property
    def url(self) -> str:
        """The cluster's URL: every metadata service's address, in order."""
        return f"graben://{','.join(self.meta_addresses)}"

    @property
    def meta(self) -> subprocess.Popen[str]:
        """The first metadata service (the one ``restart_meta`` restarts)."""
        return self.metas[0]

    @property
    def meta_address(self) -> str:
        return self.meta_addresses[0]

    def _meta_argv(self, j: int, engine: Path | str) -> tuple[str, ...]:
        url = engine if isinstance(engine, str) else f"sqlite:///{engine}"
        return (
            *("meta", "serve", *(("--init",) if self.init and j == 0 else ())),
            *("--engine", url, "--listen", f"127.0.0.1:{self._port + j if self._port else 0}"),
            *self._meta_args,
            *self._metrics_at(j and self._count + j),  # the other services after the nodes
            *(("--status", self._status) if self._status is not None and j == 0 else ()),
            *self._meta_tail,
        )

    def _metrics_at(self, offset: int) -> tuple[str, ...]:
        """``--metrics`` of server number ``offset`` (0: the first service, 1 + i: node i);
        port 0 stays 0 (any free port) for each."""
        if self._metrics is None or isinstance(self._metrics, str):
            return () if self._metrics is None else ("--metrics", self._metrics)
        host, port = self._metrics
        return ("--metrics", f"{host}:{port + offset if port else 0}")

    def _node_listen(self, i: int) -> tuple[str, ...]:
        if self._node_port is None:
            return ()
        return ("--listen", f"127.0.0.1:{self._node_port + i if self._node_port else 0}")

    def start_node(self, i: int, *, meta: str | None = None, listen: str = "") -> None:
        """Start data node ``i`` (again), heartbeating to ``meta`` (default: this cluster's
        services, ``nodes_meta_first`` first); ``listen``: on that address (default: its
        port of the cluster's)."""
        proc, address = spawn(*self._node_argv(i, meta), *(("--listen", listen) if listen else ()))
        if i < len(self.nodes):
            self.nodes[i], self.addresses[i] = proc, address
        else:
            self.nodes.append(proc)
            self.addresses.append(address)

    def _node_argv(self, i: int, meta: str | None = None) -> tuple[str, ...]:
        return (
            *("node", "serve", "--data", str(self.node_dir(i))),
            *("--meta", meta or self._nodes_meta(), "--rack", f"rack{i}"),
            *self._node_listen(i),
            *self._metrics_at(1 + i),
            *self._node_tail,
            *self._node_args_of(i),
        )

    def tend(self, say: Say) -> None:
        """Restart each server found dead, on its address, after a backoff that doubles
        each time it dies again (see ``_restarts``); ``say`` each death with its return
        code, and each restart."""
        now = time.monotonic()
        for role, procs in (("metadata service", self.metas), ("data node", self.nodes)):
            for i, proc in enumerate(procs):
                backoff = self._backoffs.setdefault((role, i), Backoff(started_at=now))
                if backoff.restart_at is None and proc.poll() is not None:
                    self._died(role, i, proc, backoff.died(now), say)
                elif backoff.due(now):
                    self._restart(role, i, backoff, say)

    def _died(self, role: str, i: int, proc: subprocess.Popen[str], delay: float, say: Say) -> None:
        if proc.stdout is not None:
            proc.stdout.close()
        address = (self.meta_addresses if role.startswith("meta") else self.addresses)[i]
        say(
            f"graben cluster: {role} {i} ({address}, pid {proc.pid}) "
            f"{exit_words(proc.returncode)}; restarting it in {delay:g} s"
        )

    def _restart(self, role: str, i: int, backoff: Backoff, say: Say) -> None:
        meta = role.startswith("meta")
        address = (self.meta_addresses if meta else self.addresses)[i]
        argv = self._meta_argv(i, self.engine) if meta else self._node_argv(i)
        try:
            if meta:
                self.metas[i], _ = spawn(*argv, "--listen", address)
            else:
                self.start_node(i, listen=address)
        except Unavailable as exc:
            delay = backoff.died(time.monotonic())
            by_hand = " ".join(("graben", *argv, "--listen", address))
            say(
                f"graben cluster: {role} {i} did not start again ({exc.message}); trying again "
                f"in {delay:g} s (by hand: {by_hand})"
            )
            return
        backoff.started(time.monotonic())
        pid = (self.metas if meta else self.nodes)[i].pid
        say(f"graben cluster: {role} {i} started again ({address}, pid {pid})")

    def _nodes_meta(self) -> str:
        first = self._nodes_meta_first
        return ",".join(self.meta_addresses[first:] + self.meta_addresses[:first])

    def node_dir(self, i: int) -> Path:
        """Data node ``i``'s ``--data``."""
        return self.root / f"node{i}"

    def kill(self, i: int) -> None:
        """SIGKILL data node ``i``."""
        kill(self.nodes[i])

    def kill_meta(self, j: int) -> None:
        """SIGKILL metadata service ``j``."""
        kill(self.metas[j])

    def restart_meta(
        self, *, down_s: float = 0.0, engine: Path | str | None = None, extra: tuple[str, ...] = ()
    ) -> None:
        """SIGKILL the first metadata service and start it again ``down_s`` later, on the
        same address (and engine, unless another is given: a URL, or a SQLite file);
        ``extra``: flags for it this time."""
        kill(self.meta)
        time.sleep(down_s)
        argv = self._meta_argv(0, engine or self.engine)
        self.metas[0], _ = spawn(*argv, *extra, "--listen", self.meta_address)

    def wait_alive(self, count: int) -> None:
        """Return once ``count`` data nodes have heartbeated since the cluster started."""
        wait_for_nodes(self.url, count, self._token, since=self._started, tls=self.tls)

    def close(self) -> None:
        """Stop every server (SIGTERM, the nodes first)."""
        stop([*self.metas, *self.nodes])

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _token(secret_file: Path) -> str:
    return auth.client_token(auth.load_secret(secret_file))


@contextlib.contextmanager
def cluster_up(
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
            *("--nodes", str(nodes), "--root", str(root), "--port", "0"),
            *(*secret, *metadata, *extra),
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
        stop([proc])


def is_new_store(root: Path, engine: str | None = None) -> bool:
    """Whether the cluster in ``root`` has no store yet (its first service needs
    ``--init``). Refuses a lost ``meta.db`` beside data nodes that already belong to a
    store. With another ``engine``, the store is new if no data node in ``root``
    belongs to one."""
    joined = sorted(str(p.parent) for p in root.glob("node*/store-id"))
    if engine is not None:
        return not joined
    if (root / "meta.db").exists():
        return False
    if joined:
        raise IntegrityError(
            f"the metadata database is missing, but data nodes already belong to a store "
            f"({', '.join(joined)}); refusing to start a new, empty store over their "
            "chunks (restore meta.db)",
            str(root / "meta.db"),
        )
    return True
