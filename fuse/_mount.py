"""Mounting and unmounting: the daemon's life.

``mount`` in the background starts the daemon as a new process (its own
session, so the shell that started it can go) and returns once the daemon
says the mount is ready, or with the daemon's error. A mount point whose
daemon died (``ENOTCONN``, or ``ECONNABORTED``) is unmounted first, so a crash never blocks the
next mount.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import logging
import os
import select
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import pyfuse3
import pyfuse3.asyncio

from graben.store import (
    Client,
    GrabenError,
    adopt_loop,
    connect,
    read_token_file,
    serve_metrics,
)

from ._aio import Readable, Tasks, in_thread
from ._follow import FOLLOW_S, follow
from ._metrics import MountMetrics
from ._openers import mount_device
from ._ops import Operations
from ._options import MountOptions, default_spool
from ._spool import Spool

log = logging.getLogger("graben.fuse")
READY_TIMEOUT_S = 60.0
IDLE_S = 2.0
"""A mount that took no chunk buffer for this long gives back the memory it holds."""
"""How long ``mount`` waits for the daemon to say the mount is ready (longer than a
client keeps trying an unreachable store, so that the daemon's own error is logged)."""
DEAD_MOUNT = (errno.ENOTCONN, errno.ECONNABORTED)
"""What a mount whose daemon is gone answers (Linux 6.18 says ``ECONNABORTED``)."""
READ_AHEAD_KB = 4096
"""The mount's kernel read-ahead (see ``_widen_read_ahead``)."""
INIT_SETTLE_S = 0.2
"""Time for the kernel to take the FUSE INIT reply once the session runs."""
_daemons: dict[str, subprocess.Popen[bytes]] = {}
"""Daemons this process started, by mount point: ``unmount`` waits for them to end."""
DAEMON_EXIT_S = 10.0
"""How long ``unmount`` waits for the daemon to finish before killing it."""


class MountError(GrabenError, OSError):
    """The mount could not be made."""


def mount(
    url: str,
    mountpoint: str | os.PathLike[str],
    options: MountOptions | None = None,
    *,
    foreground: bool = False,
) -> int | None:
    """Mount the store at ``url`` on ``mountpoint``.

    In the background (the default) this returns the daemon's pid once the
    mount is ready; with ``foreground`` it serves until unmounted or
    signalled, then returns ``None``.
    """
    options = options or MountOptions()
    target = Path(mountpoint).absolute()
    clean_stale(target)
    if os.path.ismount(target):
        raise MountError("already mounted (graben umount it first)", str(target))
    if not target.exists():
        raise MountError("no such directory: make the mount point first", str(target))
    if not target.is_dir():
        raise MountError("the mount point must be a directory", str(target))
    if foreground:
        serve(url, target, options)
        return None
    return _start_daemon(url, target, options)


def unmount(
    mountpoint: str | os.PathLike[str], *, lazy: bool = False, busy_wait: float = 0
) -> None:
    """Unmount (``fusermount3 -u``); ``lazy`` detaches a mount still in use.

    A mount busy for a moment (a file closed just now) is tried again for up
    to ``busy_wait`` seconds. If this process started the mount's daemon,
    return once the daemon is gone.
    """
    target = os.fspath(Path(mountpoint).absolute())
    command = ["fusermount3", "-u", *(["-z"] if lazy else []), target]
    deadline = time.monotonic() + busy_wait
    while (done := subprocess.run(command, capture_output=True, text=True, check=False)).returncode:
        if mount_device(target) is None:
            raise MountError("not mounted", target)
        if time.monotonic() >= deadline or "busy" not in done.stderr:
            why = done.stderr.strip() or f"fusermount3 failed ({done.returncode})"
            raise MountError(why, target)
        time.sleep(0.1)
    process = _daemons.pop(target, None)
    if process is not None:
        try:
            process.wait(DAEMON_EXIT_S)
        except subprocess.TimeoutExpired:
            log.warning("%s: the daemon did not stop; killing it", target)
            process.kill()
            process.wait()


def clean_stale(target: Path) -> bool:
    """Unmount ``target`` if its daemon is gone; whether it was."""
    try:
        os.stat(target)
    except OSError as exc:
        if exc.errno not in DEAD_MOUNT:
            return False
        log.warning("%s: its daemon is gone; unmounting it", target)
        unmount(target, lazy=True)
        return True
    return False


def serve(url: str, target: Path, options: MountOptions, ready_fd: int | None = None) -> None:
    """Run the mount in this process until it is unmounted or signalled.

    With ``ready_fd``, tell the process that started this one how it went:
    ``b"1"`` once mounted, or ``b"0"`` and one line saying why not; then close it.
    """
    pyfuse3.asyncio.enable()
    asyncio.run(_serve(url, target, options, ready_fd))


async def _serve(url: str, target: Path, options: MountOptions, ready_fd: int | None) -> None:
    """``serve`` on the daemon's loop, which the store client shares (``adopt_loop``): the
    handlers await its calls with no hand-off. What blocks (the client's making, the
    mount, the teardown) runs in a worker thread."""
    adopt_loop()
    stack = contextlib.ExitStack()
    try:
        try:
            ops = await in_thread(_mounted, stack, url, target, options)
        except Exception as exc:
            if ready_fd is not None:
                _send_ready(ready_fd, b"0" + _one_line(exc).encode(errors="replace"))
            raise
        if ready_fd is not None:
            _send_ready(ready_fd, b"1")
        log.info("mounted %s on %s", url, target)
        await _main(ops)
    finally:
        await in_thread(stack.close)


def _mounted(
    stack: contextlib.ExitStack, url: str, target: Path, options: MountOptions
) -> Operations:
    """Everything a mount needs, set up, with FUSE mounted on ``target``; ``stack``
    takes it all down again (the mount first)."""
    spool = Spool(private_directory(options.spool_dir), options.spool_limit)
    stack.callback(spool.close)
    token = None if options.token_file is None else read_token_file(options.token_file)
    client = stack.enter_context(connect(url, wait=options.wait, token=token))
    client.stat("/")  # an unreachable store fails the mount, not every call after it
    read_only, reach = _token_reach(client, options.read_only)
    ops = Operations(client, spool, read_only=read_only, timeout=options.timeout, reach=reach)
    stop_metrics = _serve_metrics(ops, options.metrics)
    if stop_metrics is not None:
        stack.callback(stop_metrics)
    fuse_options = set(pyfuse3.default_options) | {"fsname=graben", "subtype=graben", "noatime"}
    if read_only:
        fuse_options.add("ro")
    if options.allow_other:
        fuse_options.add("allow_other")
    try:
        pyfuse3.init(ops, os.fspath(target), fuse_options)
    except RuntimeError as exc:  # pyfuse3 says only which libfuse call failed
        why = f"FUSE refused the mount ({exc}): is /dev/fuse there, and fusermount3?"
        raise MountError(why, os.fspath(target)) from exc
    stack.callback(_unmounted, target)
    ops.device = _device(target)
    return ops


def _token_reach(client: Client, read_only: bool) -> tuple[bool, str]:
    """Whether the mount is read-only, and where it may write: a tenant's token without the
    write right makes it read-only, one with it writes at and below its prefix only. The
    store checks every write again; this makes the kernel refuse at open or create
    (``EROFS``, ``EACCES``) what the store would refuse only after the writer's close."""
    token = None if client.local else client.whoami()  # an embedded store has no tokens
    if token is None:
        return read_only, "/"
    if "w" not in token.rights:
        log.info("token %s has no write right: mounted read-only", token.id)
        return True, token.prefix
    log.info("token %s writes at and below %s only", token.id, token.prefix)
    return read_only, token.prefix


def _unmounted(target: Path) -> None:
    pyfuse3.close(unmount=True)
    log.info("unmounted %s", target)


def _send_ready(fd: int, message: bytes) -> None:
    try:
        os.write(fd, message[:4096])  # one write under PIPE_BUF: the reader gets it whole
    finally:
        os.close(fd)


def _one_line(exc: BaseException) -> str:
    """What went wrong, as the command line shows an error: one line."""
    if isinstance(exc, GrabenError):
        text = exc.message if exc.path is None else f"{exc.message}: {exc.path}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())


def _serve_metrics(ops: Operations, where: str | None) -> Callable[[], None] | None:
    """Serve the mount's metrics at ``where`` (``HOST:PORT``), if asked for; what stops it."""
    if where is None:
        return None
    host, _, port = where.rpartition(":")
    if not host or not port.isdigit():
        raise MountError(f"--metrics wants HOST:PORT, not {where!r}")
    metrics = MountMetrics(ops)
    address, stop = serve_metrics(metrics.registry, host, int(port))
    log.info("metrics at http://%s/metrics", address)
    metrics.instrument(ops)
    return stop


def private_directory(path: Path) -> int:
    """An open descriptor of the directory ``path``, made (0700) if it is missing.

    Anyone who may write in the spool could plant a symbolic link where the
    mount writes (its log) and have it write over their target with our
    rights. So the directory must be ours, not a link, and closed to group
    and others; the descriptor is then used, not the path, which another
    user could swap afterwards.
    """
    if path == default_spool():  # its parent is the user's graben directory: private too
        os.close(_private(path.parent, "the user's graben directory"))
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
    return _private(path, "the spool")


def _private(path: Path, what: str) -> int:
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise MountError(f"{what} must be a directory: {_what(path, exc)}", str(path)) from exc
    why = _not_private(os.fstat(fd))
    if why:
        os.close(fd)
        raise MountError(f"{what} {why}; give the mount another spool", str(path))
    return fd


def _what(path: Path, exc: OSError) -> str:
    """What stopped ``path`` from opening (a link is refused, never followed)."""
    return "it is a symbolic link (never followed)" if path.is_symlink() else str(exc.strerror)


def _not_private(st: os.stat_result) -> str:
    """Why a directory is no private one ("" if it is)."""
    if st.st_uid != os.geteuid():
        return f"belongs to uid {st.st_uid}, not to you (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"is writable by others (mode {stat.S_IMODE(st.st_mode):o}: chmod go-w it)"
    return ""


def _open_log(options: MountOptions, spool: int) -> tuple[int, Path]:
    """The daemon's log, opened to append, never through a link; and its path."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
    if options.log_file is None:
        fd = os.open("mount.log", flags, 0o600, dir_fd=spool)
        return fd, options.spool_dir / "mount.log"
    path = options.log_file
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        raise MountError(f"cannot open the log: {_what(path, exc)}", str(path)) from exc
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != os.geteuid():
        os.close(fd)  # a hard link could be another file's inode under the log's name
        why = "the log must be a plain file of yours (no device, no hard link)"
        raise MountError(why, str(path))
    return fd, path


def _device(target: Path) -> str | None:
    """The mount's device, read from ``/proc``: the daemon must not touch its own mount."""
    try:
        return mount_device(os.fspath(target))
    except OSError as exc:
        log.info("could not tell the device of %s (%s)", target, exc)
        return None


class _Pool(Protocol):
    taken: int

    def trim(self) -> None: ...


async def _give_back_when_idle(pool: _Pool) -> None:
    """Once the mount has taken no chunk buffer for ``IDLE_S``, unmap those the store
    client keeps for reuse and hand the heap's free pages back to the system (glibc's
    ``malloc_trim``): a mount left running holds what a burst of I/O needed only while
    the burst lasts (a 512 MiB write and read left ~80 MiB resident before)."""
    try:
        trim_heap = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        trim_heap = None
    seen, given_back = pool.taken, True
    while True:
        await asyncio.sleep(IDLE_S)
        if pool.taken != seen:
            seen, given_back = pool.taken, False
        elif not given_back:
            given_back = True
            pool.trim()
            if trim_heap is not None:
                await in_thread(trim_heap, 0)


async def _widen_read_ahead(device: str | None) -> None:
    """Let the kernel read ahead 4 MiB, in 1 MiB requests, instead of 128 KiB ones.

    The kernel's default for a FUSE mount is 128 KiB; each request costs a
    round trip through the daemon, and 1 MiB ones double a sequential
    read's throughput here. Set once the kernel has taken our INIT reply
    (which sets it too). Needs root (the knob is in sysfs).
    """
    await asyncio.sleep(INIT_SETTLE_S)
    if device is not None:
        await in_thread(_set_read_ahead, device)


def _set_read_ahead(device: str) -> None:
    try:
        with open(f"/sys/class/bdi/{device}/read_ahead_kb", "w") as knob:
            knob.write(str(READ_AHEAD_KB))
    except OSError as exc:
        log.info("kept the kernel's read-ahead for the mount (%s)", exc)


async def _main(ops: Operations) -> None:
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(signum, pyfuse3.terminate)
    tasks = ops.nursery = Tasks()
    tasks.start_soon(_widen_read_ahead, ops.device)
    tasks.start_soon(_give_back_when_idle, ops.client.aio.pool)
    tasks.start_soon(
        follow,
        ops.changes,
        ops.current,
        ops.inodes,
        ops.known,
        ops.whole,
        ops.weighing,
        FOLLOW_S,
        ops.exact,
    )
    readable = Readable(pyfuse3.asyncio.ClosedResourceError)
    pyfuse3.asyncio.wait_readable = readable.wait_readable
    pyfuse3.asyncio.notify_closing = readable.notify_closing
    try:
        await pyfuse3.main()
    finally:
        readable.close()  # the device is closed next, in a worker thread
        try:
            await ops.queue.settled()  # every change answered is in the store
        finally:
            await tasks.cancel_all()


def _start_daemon(url: str, target: Path, options: MountOptions) -> int:
    spool = private_directory(options.spool_dir)  # its own error, before the daemon's
    try:
        log_out, log_file = _open_log(options, spool)
    finally:
        os.close(spool)
    read, write = os.pipe()
    command = [
        sys.executable,
        "-m",
        "graben.fuse",
        *daemon_args(url, target, options),
        "--ready-fd",
        str(write),
    ]
    try:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log_out,
            stderr=subprocess.STDOUT,
            pass_fds=(write,),
            start_new_session=True,
        )
    finally:
        os.close(log_out)
    os.close(write)
    try:
        ready, why = _wait_ready(read, process, options.wait)
    finally:
        os.close(read)
    if not ready:
        try:  # a daemon that said why is on its way out: let it finish its log
            process.wait(timeout=5 if why else 0)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait()
        why = why or _tail(log_file) or "it died without a word"
        raise MountError(f"cannot mount on {target}: {why} (the daemon's log: {log_file})")
    _daemons[os.fspath(target)] = process
    return process.pid


def _wait_ready(read: int, process: subprocess.Popen[bytes], wait: float) -> tuple[bool, str]:
    """Whether the daemon mounted, else why not (``""`` if it did not say); ``wait``: how
    long it may try to reach its store first."""
    patience = READY_TIMEOUT_S + wait
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        ready, _, _ = select.select([read], [], [], 0.2)
        if ready:
            answer = os.read(read, 4096)  # b"" if it died first
            return answer == b"1", answer[1:].decode(errors="replace")
        if process.poll() is not None:
            return False, ""
    return False, f"not mounted after {patience:.0f} s"


def _tail(path: Path) -> str:
    """The log's last line: the error of a daemon that died without saying."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return lines[-1].strip() if lines else ""


def daemon_args(url: str, target: Path, options: MountOptions) -> list[str]:
    """``graben mount`` arguments that mount the same way in the foreground."""
    args = [url, os.fspath(target), "--foreground"]
    args += ["--spool", os.fspath(options.spool_dir), "--spool-limit", str(options.spool_limit)]
    args += ["--timeout", repr(options.timeout), "--wait", repr(options.wait)]
    args += ["--read-only"] * options.read_only + ["--allow-other"] * options.allow_other
    args += ["--log-level", options.log_level]
    args += [] if options.metrics is None else ["--metrics", options.metrics]
    token = options.token_file
    args += [] if token is None else ["--token-file", os.fspath(token.absolute())]
    return args
