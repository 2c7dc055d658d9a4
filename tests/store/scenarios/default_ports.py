"""The default ports, tried where nothing else listens: ``test_ports.py`` runs this in a
network namespace of its own (``default_ports.py meta|node TMPDIR``; exit 0: as
promised). Never run it on a machine's own network: it binds 7100 and 7200."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

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


if __name__ == "__main__":
    {"meta": _meta, "node": _node}[sys.argv[1]](Path(sys.argv[2]))
