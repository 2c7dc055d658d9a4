"""Hosts for real: Linux network namespaces joined by a bridge, for cluster tests.

``Hosts(n)`` makes ``n`` namespaces, each a "host" with its own address on a
private /24, all plugged into one bridge in the test's own namespace (which
gets the .1 address, so the test process is a host too). Every name carries
the test process's pid, so concurrent runs never collide, and everything is
removed on close, even after a failure. Needs root and ``ip``; tests skip
with the reason otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence

import pytest

CAN = os.geteuid() == 0 and shutil.which("ip") is not None
needs_netns = pytest.mark.skipif(not CAN, reason="network namespaces need root and iproute2")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class Hosts:
    """``n`` namespaced hosts on one bridge; ``address(i)``, ``spawn(i, argv)``, ``cut(i)``."""

    def __init__(self, n: int, *, subnet: int = 77) -> None:
        tag = f"g{os.getpid() % 100000}"
        self.bridge = f"{tag}br"
        self.prefix = f"10.{subnet}.{os.getpid() % 250}"
        self.names = [f"{tag}h{i}" for i in range(n)]
        self._links = [f"{tag}v{i}" for i in range(n)]
        self._procs: list[subprocess.Popen[str]] = []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.prefix}.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, (name, link) in enumerate(zip(self.names, self._links, strict=True)):
            _ip("netns", "add", name)
            _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", name)
            _ip("link", "set", link, "master", self.bridge)
            _ip("link", "set", link, "up")
            inside = ("netns", "exec", name, "ip")
            _ip(*inside, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            _ip(*inside, "link", "set", "eth0", "up")
            _ip(*inside, "link", "set", "lo", "up")

    def address(self, i: int) -> str:
        """Host ``i``'s address (the test's own namespace is ``{prefix}.1``)."""
        return f"{self.prefix}.{i + 2}"

    def spawn(self, i: int, argv: Sequence[str]) -> subprocess.Popen[str]:
        """Start ``argv`` on host ``i``; stopped on ``close``."""
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.names[i], *argv], stdout=subprocess.PIPE, text=True
        )
        self._procs.append(proc)
        return proc

    def graben(self, i: int, *args: str) -> tuple[subprocess.Popen[str], str]:
        """A ``graben`` server on host ``i``; it and the address it says it listens on."""
        proc = self.spawn(i, [sys.executable, "-m", "graben.store.cli", *args])
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line.startswith("listening on "):
            raise AssertionError(f"graben {' '.join(args)} on host {i} said {line!r}")
        return proc, line.removeprefix("listening on ")

    def cut(self, i: int, *, down: bool = True) -> None:
        """Pull host ``i``'s cable (``down=False`` plugs it back)."""
        _ip("link", "set", self._links[i], "down" if down else "up")

    def close(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        for name in self.names:
            subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)
        for link in self._links:
            subprocess.run(["ip", "link", "del", link], check=False, capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], check=False, capture_output=True)
