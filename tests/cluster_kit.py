"""A local cluster whose processes a test can kill: metadata service + N data nodes."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from graben.store._cli_cluster import _spawn, _stop, _wait_for_nodes


class LocalCluster:
    """Real server processes on loopback; ``kill(i)`` sends SIGKILL to data node ``i``."""

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
    ):
        self.root, self.scrub, self._node_args = root, scrub, node_args
        engine = f"sqlite:///{root / 'meta.db'}"
        self._meta_args = (
            *("meta", "serve", "--engine", engine, "--replication", str(replication)),
            *("--heartbeat-timeout", str(timeout), "--repair-interval", str(repair)),
            *meta_args,
        )
        self.meta, self.meta_address = _spawn(*self._meta_args)
        self.url = f"graben://{self.meta_address}"
        self.nodes: list[subprocess.Popen[str]] = []
        self.addresses: list[str] = []
        try:
            for i in range(nodes):
                self.start_node(i)
            self.wait_alive(nodes)
        except BaseException:
            self.close()  # never leave half a cluster running
            raise

    def restart_meta(self, *, down_s: float = 0.0) -> None:
        """SIGKILL the metadata service and start it again on the same port and engine."""
        self.meta.send_signal(signal.SIGKILL)
        self.meta.wait()
        if self.meta.stdout is not None:
            self.meta.stdout.close()
        time.sleep(down_s)
        self.meta, _ = _spawn(*self._meta_args, "--listen", self.meta_address)

    def start_node(self, i: int) -> None:
        proc, address = _spawn(
            *("node", "serve", "--data", str(self.root / f"node{i}")),
            *("--meta", self.meta_address, "--rack", f"rack{i}"),
            *("--scrub-interval", str(self.scrub)),
            *self._node_args,
        )
        if i < len(self.nodes):
            self.nodes[i], self.addresses[i] = proc, address
        else:
            self.nodes.append(proc)
            self.addresses.append(address)

    def node_dir(self, i: int) -> Path:
        return self.root / f"node{i}"

    def chunk_files(self, i: int) -> list[Path]:
        return sorted(p for p in (self.node_dir(i) / "chunks").glob("??/??/*") if p.is_file())

    def kill(self, i: int) -> None:
        self.nodes[i].send_signal(signal.SIGKILL)
        self.nodes[i].wait()

    def wait_alive(self, count: int) -> None:
        _wait_for_nodes(self.url, count)

    def close(self) -> None:
        _stop([self.meta, *self.nodes])
