"""The default ports, tried where nothing else listens: ``test_ports.py`` runs this in a
network namespace of its own (``default_ports.py meta|node TMPDIR``; exit 0: as
promised). Never run it on a machine's own network: it binds 7100, 7200 and their
metrics' ports, 8100 and up."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from graben.store import connect
from graben.store.local import spawn, stop

GRABEN = (sys.executable, "-m", "graben.store.cli")


def _meta(root: Path) -> None:
    """A metadata service given no port takes 7100; a second one says it is taken."""
    engine = ("--engine", f"sqlite:///{root / 'meta.db'}")
    first, address = spawn("meta", "serve", "--init", *engine)
    try:
        assert address == "127.0.0.1:7100", address
        second = subprocess.run(
            [*GRABEN, "meta", "serve", *engine],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 1, second
        assert "cannot listen on 127.0.0.1:7100" in second.stderr, second.stderr
        assert "Traceback" not in second.stderr, second.stderr
    finally:
        stop([first])


def _node(root: Path) -> None:
    """A node given no port takes the first free one from 7200."""
    meta, address = spawn(
        "meta",
        "serve",
        "--init",
        "--engine",
        f"sqlite:///{root / 'meta.db'}",
        "--listen",
        "127.0.0.1:0",
    )
    held = socket.create_server(("127.0.0.1", 7200))
    try:
        node, where = spawn("node", "serve", "--data", str(root / "n"), "--meta", address)
        try:
            host, port = where.rsplit(":", 1)
            assert host == "127.0.0.1", where
            assert 7200 < int(port) < 7300, where  # 7200 is ours: the next free one
        finally:
            stop([node])
    finally:
        held.close()
        stop([meta])


def _metrics(root: Path) -> None:
    """Each server serves its metrics beside its own port (+1000) unless that is taken,
    then on any free one; the cluster records where, and ``graben stats`` finds them."""
    os.environ.pop("GRABEN_METRICS", None)  # the tests' own: any free port
    meta, address = spawn("meta", "serve", "--init", "--engine", f"sqlite:///{root / 'meta.db'}")
    held = socket.create_server(("127.0.0.1", 8200))  # the first node's metrics port
    nodes = []
    try:
        for i in range(2):
            nodes.append(spawn("node", "serve", "--data", str(root / f"n{i}"), "--meta", address))
        assert [where for _, where in nodes] == ["127.0.0.1:7200", "127.0.0.1:7201"], nodes
        with connect(f"graben://{address}") as client:
            deadline = time.monotonic() + 30
            while len((health := client.health()).nodes) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
        assert [s.metrics for s in health.services] == ["127.0.0.1:8100"], health.services
        by_address = {n.address: n.metrics for n in health.nodes}
        assert by_address["127.0.0.1:7201"] == "127.0.0.1:8201", by_address
        taken = by_address["127.0.0.1:7200"]  # 8200 was taken: any free port instead
        assert taken.startswith("127.0.0.1:") and taken != "127.0.0.1:8200", by_address
        for at in ("127.0.0.1:8100", "127.0.0.1:8201", taken):
            with urllib.request.urlopen(f"http://{at}/metrics", timeout=5) as reply:
                assert b"graben_requests_total" in reply.read(), at
        stats = subprocess.run(
            [*GRABEN, "stats", "--once", "--interval", "0.2", "--store", f"graben://{address}"],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "COLUMNS": "80"},
        )
        assert stats.returncode == 0, stats.stderr
        for name in ("meta 127.0.0.1:7100", "node 127.0.0.1:7200", "node 127.0.0.1:7201"):
            assert name in stats.stdout, stats.stdout
        assert max(len(line) for line in stats.stdout.splitlines()) <= 80, stats.stdout
    finally:
        held.close()
        stop([proc for proc, _ in nodes] + [meta])


if __name__ == "__main__":
    {"meta": _meta, "node": _node, "metrics": _metrics}[sys.argv[1]](Path(sys.argv[2]))
