"""``mount-tools``: the tools people run on a tree, on graben's mounts beside the peers.

A generated tree (``_tree``: 2,000 files, ~45 MB, nested, empty files to 1 MiB;
``--quick`` 1,000) with a git repository in it is kept on the local disk. On each
system in turn (the local disk itself, graben's mount of an embedded store and of
a 3-node cluster at RF=1, SeaweedFS ``000`` and JuiceFS, the order rotating with
the trial) the real programs run, each timed around ``subprocess.run``:

- ``cp -a SRC DST``, then ``sync``;
- ``find DST``; ``du -s DST``;
- ``tar c DST`` into a pipe this process drains, after ``sync`` and
  ``echo 3 > /proc/sys/vm/drop_caches`` (GNU tar reads nothing when its archive
  is ``/dev/null``, hence the pipe); if the caches cannot be dropped, the row's
  name says so;
- ``tar x`` of a tarball on the local disk into a new directory, then ``sync``;
- ``rsync -a SRC/ DST2/``, then ``sync``; a second pass (nothing to copy), then
  ``sync``;
- ``git status`` in DST (a copy's files have new inode numbers and ctimes, so git
  reads every file again and rewrites its index), which must report a clean tree;
- ``rm -rf DST``, then ``sync``.

Every write step ends with one ``sync`` on every system, so each figure is
durable. Each write step writes a tree of its own (the same shape, its files
starting with bytes of their own): graben would otherwise find the chunks of
an earlier step already stored.

Rows: seconds per tool per system (``TOOL: SYSTEM``) beside the local disk's,
and for each of graben's mounts ``TOOL: SYSTEM vs the faster peer``, the faster
peer's seconds over graben's in the same trial (above 1: graben is faster; no
ratio column of its own). A tool that fails is a row named ``..., failed
(REASON)`` with the seconds until it failed, and its error printed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter

from graben.store import Unavailable
from graben.store.local import cluster_up, make_secret_file

from .. import _peers, _tree
from .._context import Context
from .._kit import MiB, drop_all_caches, environ, need_space
from .._peers import Mount
from .._registry import Result, Skip, workload
from .mounts import EMBEDDED, SYSTEMS, _fixture, _target, mounted

NAME = "mount-tools"
LOCAL = "local disk"
CLUSTER_RF1 = "graben cluster RF=1"
PEERS = ("SeaweedFS", "JuiceFS")
FILES, QUICK_FILES = 2000, 1000
TIMEOUT_S = 600.0
"""How long one tool may run before it counts as failed (and is killed)."""
GIT = ("git", "-c", "safe.directory=*", "-c", "user.name=bench", "-c", "user.email=bench@localhost")
VERSUS = " vs the faster peer"
FASTER_PEER = "faster peer"
"""The baseline the ratio rows name: no row is it (their value is already the ratio)."""


# -- the systems ---------------------------------------------------------------------------


@contextmanager
def _cluster_rf1(ctx: Context) -> Iterator[str]:
    """A fixture: a 3-node cluster of its own whose files keep one copy; yields its URL."""
    root = ctx.shared / "cluster-rf1"
    root.mkdir(parents=True, exist_ok=True)
    secret = make_secret_file(root / "secret")
    try:
        with (
            environ({"GRABEN_SECRET_FILE": str(secret)}),
            cluster_up(root, 3, secret_file=secret, extra=("--replication", "1")) as url,
        ):
            yield url
    except Unavailable as exc:
        raise Skip(str(exc)) from None


_MOUNT_RF1 = _fixture(
    lambda ctx: _peers.graben(
        ctx.shared / "mount-cluster-rf1",
        ctx.fixture(_cluster_rf1),
        CLUSTER_RF1,
        data=ctx.shared / "cluster-rf1",
    )
)
_SYSTEMS = {EMBEDDED: SYSTEMS[EMBEDDED], CLUSTER_RF1: _MOUNT_RF1} | {p: SYSTEMS[p] for p in PEERS}


def _mounts(ctx: Context) -> list[Mount]:
    """The mounts that run here (the others named once), in this trial's order; with
    ``--target DIR``, that directory alone."""
    if ctx.target_url is not None:
        raise Skip(f"{NAME} needs a mounted directory: --target DIR, not a store's URL")
    if ctx.target_path is not None:
        return [ctx.fixture(_target)]
    return mounted(ctx, _SYSTEMS, NAME)


# -- the sources on local disk ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sources:
    """A trial's trees on the local disk, one per write step."""

    copy: Path
    """What ``cp -a`` copies: a git repository, committed."""
    tarball: Path
    """What ``tar x`` unpacks (a tree of its own, as one ``tar``)."""
    rsync: Path
    """What ``rsync -a`` copies (a tree of its own)."""


def _sources(ctx: Context) -> Sources:
    files = QUICK_FILES if ctx.quick else FILES
    budget = max(MiB, ctx.size // 8)  # tiny --size runs get a tree to match
    largest = min(MiB, max(4096, budget // 16))
    entries = _tree.shape(max(24, min(files, budget // (22 * 1024))), largest)
    root, nonce = ctx.scratch / "sources", uuid.uuid4().hex
    with ctx.step(f"{NAME}: generating {len(entries)} files x 3", 3):
        for part in ("copy", "tarred", "rsync"):
            _tree.write(root / part / "tree", entries, f"{nonce}-{part}")
    need_space(ctx.scratch, 8 * sum(e.size for e in entries))
    _check(_run([*GIT, "init", "-q"], root / "copy" / "tree"))
    _check(_run([*GIT, "add", "-A"], root / "copy" / "tree"))
    _check(_run([*GIT, "commit", "-q", "-m", "the tree"], root / "copy" / "tree"))
    tarball = root / "tree.tar"
    _check(_run(["tar", "-cf", str(tarball), "-C", str(root / "tarred"), "tree"], root))
    return Sources(root / "copy" / "tree", tarball, root / "rsync" / "tree")


# -- running one tool ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ran:
    """One tool's run."""

    seconds: float
    """From its start to the end of the ``sync`` after it (if any)."""
    failure: str | None = None
    """Why it failed (exit status, timeout, wrong output); ``None`` if it did not."""
    output: bytes = b""
    """What it wrote on stdout (for the tools whose output is checked)."""


def _run(args: list[str], cwd: Path, *, sync: bool = False, keep: bool = False) -> Ran:
    """``args`` run in ``cwd`` and timed, then ``sync`` if asked; stdout kept if ``keep``."""
    out = subprocess.PIPE if keep else subprocess.DEVNULL
    start = perf_counter()
    try:
        done = subprocess.run(
            args, cwd=cwd, stdout=out, stderr=subprocess.PIPE, timeout=TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:  # run() has killed it and waited for it
        return Ran(perf_counter() - start, f"no answer in {TIMEOUT_S:.0f} s")
    if sync:
        os.sync()
    seconds = perf_counter() - start
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()[-3:]
        return Ran(seconds, f"exit {done.returncode}: {' / '.join(said)}")
    return Ran(seconds, None, done.stdout or b"")


def _tar_c(tree: Path) -> Ran:
    """``tar c`` of ``tree`` into a pipe, drained here (seconds until it exits)."""
    start = perf_counter()
    proc = subprocess.Popen(
        ["tar", "-cf", "-", "-C", str(tree.parent), tree.name],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        while proc.stdout.read(MiB):
            pass
        code = proc.wait(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    return Ran(perf_counter() - start, None if code == 0 else f"exit {code}")


def _check(ran: Ran) -> None:
    """Raise if an untimed step (making the sources) failed."""
    if ran.failure is not None:
        raise RuntimeError(f"{NAME}: preparing the sources: {ran.failure}")


# -- the tools, on one system ------------------------------------------------------------------


def _tools(src: Sources, where: Path) -> Iterator[tuple[str, Ran]]:
    """Each tool on the system whose directory is ``where``, in order: (its name, its run)."""
    copy, unpacked, synced = where / "cp", where / "x", where / "rsync"
    yield "cp -a, then sync", _run(["cp", "-a", str(src.copy), str(copy)], where, sync=True)
    yield "find", _run(["find", str(copy)], where)
    yield "du -s", _run(["du", "-s", str(copy)], where)
    dropped = drop_all_caches()
    yield ("tar c, caches dropped" if dropped is None else f"tar c, {dropped}"), _tar_c(copy)
    unpacked.mkdir()
    tar_x = ["tar", "-xf", str(src.tarball), "-C", str(unpacked)]
    yield "tar x, then sync", _run(tar_x, where, sync=True)
    rsync = ["rsync", "-a", f"{src.rsync}/", f"{synced}/"]
    yield "rsync -a, then sync", _run(rsync, where, sync=True)
    yield "rsync -a again (nothing to copy), then sync", _run(rsync, where, sync=True)
    yield "git status", _clean(_run([*GIT, "status", "--porcelain"], copy, keep=True))
    yield "rm -rf, then sync", _run(["rm", "-rf", str(copy)], where, sync=True)


def _clean(ran: Ran) -> Ran:
    """``git status --porcelain``'s run, failed if it lists any change."""
    if ran.failure is None and ran.output.strip():
        listed = ran.output.decode(errors="replace").splitlines()
        return Ran(ran.seconds, f"not clean: {len(listed)} changes, {listed[0]!r}")
    return ran


def _on(ctx: Context, src: Sources, system: str, root: Path) -> dict[str, Ran]:
    """Every tool's run on ``system`` in a new directory under ``root``, removed after."""
    where = root / f"{NAME}-trial{ctx.trial}"
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    runs: dict[str, Ran] = {}
    try:
        with ctx.step(f"{NAME}: {system}", 9) as advance:
            for tool, ran in _tools(src, where):
                runs[tool] = ran
                if ran.failure is not None:
                    ctx.console.print(f"[red]{NAME}: {tool} failed on {system}: {ran.failure}")
                advance(1)
    finally:
        shutil.rmtree(where, ignore_errors=True)
        os.sync()
    return runs


# -- rows --------------------------------------------------------------------------------------


def _rows(times: dict[str, dict[str, Ran]]) -> list[Result]:
    """Seconds per tool per system beside the local disk's; graben's against the faster peer."""
    rows = []
    for tool in times[LOCAL]:
        base = f"{tool}: {LOCAL}"
        for system, runs in times.items():
            ran = runs[tool]
            failed = "" if ran.failure is None else f", failed ({ran.failure[:160]})"
            rows.append(Result(NAME, f"{tool}: {system}{failed}", ran.seconds, "s", base))
        rows += _versus(tool, times)
    return rows


def _versus(tool: str, times: dict[str, dict[str, Ran]]) -> list[Result]:
    """For each of graben's mounts, the faster peer's seconds over its own (both succeeded)."""
    peers = [r[tool].seconds for s, r in times.items() if s in PEERS and r[tool].failure is None]
    if not peers:
        return []
    return [
        Result(NAME, f"{tool}: {system}{VERSUS}", min(peers) / runs[tool].seconds, "x", FASTER_PEER)
        for system, runs in times.items()
        if system in (EMBEDDED, CLUSTER_RF1) and runs[tool].failure is None
    ]


@workload(NAME, "cp -a, tar, find, du, rsync, git status, rm -rf of a tree: vs JuiceFS, SeaweedFS")
def mount_tools(ctx: Context) -> list[Result]:
    """Seconds per tool per system (the local disk's beside); graben's against the faster peer."""
    mounts = _mounts(ctx)
    src = _sources(ctx)
    times = {LOCAL: _on(ctx, src, LOCAL, ctx.scratch / "local")}
    for mount in mounts:
        times[mount.name] = _on(ctx, src, mount.name, mount.point)
    return _rows(times)
