"""Memory agents for tests: real ``graben agent serve`` processes, each its own "host".

``Agents(tmp)`` starts agents on loopback (or, given a ``Hosts``, inside network
namespaces), each with a directory of its own in ``/dev/shm``; ``kill`` is
SIGKILL, ``wipe`` removes what the host's memory held (a host that rebooted
or is gone), and everything is stopped and removed on close.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from netns_kit import Hosts
from ranks_kit import free_port


class Agents:
    """Agents by name; ``start(name, limit, peers=...)`` returns the address it listens on."""

    def __init__(self, hosts: Hosts | None = None) -> None:
        self.tag = uuid.uuid4().hex[:8]
        self.hosts = hosts
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.addresses: dict[str, str] = {}
        self.dirs: dict[str, Path] = {}
        """Agents' directories other than their own in ``/dev/shm`` (a small tmpfs, say)."""

    def dir(self, name: str) -> Path:
        return self.dirs.get(name) or Path(f"/dev/shm/graben-test-{self.tag}-{name}")

    def address(self, name: str, host: int | None = None) -> str:
        """The address agent ``name`` has (or will have: peers are named before they start)."""
        if name not in self.addresses:
            where = "127.0.0.1" if host is None or self.hosts is None else self.hosts.address(host)
            self.addresses[name] = f"{where}:{free_port()}"
        return self.addresses[name]

    def start(
        self,
        name: str,
        limit: str = "256M",
        *,
        peers: tuple[str, ...] = (),
        keep: int = 2,
        host: int | None = None,
        extra: tuple[str, ...] = (),
    ) -> str:
        address = self.address(name, host)
        argv = [
            sys.executable,
            *("-m", "graben.store.cli", "agent", "serve"),
            *("--dir", str(self.dir(name)), "--memory-limit", limit, "--keep", str(keep)),
            *("--listen", address),
            *(("--peer", ",".join(self.address(p) for p in peers)) if peers else ()),
            *extra,
        ]
        if host is not None and self.hosts is not None:
            proc = self.hosts.spawn(host, argv)
        else:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line == f"listening on {address}", line
        self.procs[name] = proc
        return address

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def wipe(self, name: str) -> None:
        shutil.rmtree(self.dir(name), ignore_errors=True)

    def close(self) -> None:
        for name in list(self.procs):
            self.kill(name)
        for name in self.addresses:
            self.wipe(name)

    def __enter__(self) -> Agents:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
