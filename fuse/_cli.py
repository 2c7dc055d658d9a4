"""``graben mount`` and ``graben umount``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from graben.store import LogFormatter, parse_size

from ._options import MountOptions

_URL_HELP = "an embedded store directory, or graben://host:port for a cluster"
LOG_LEVELS = ("debug", "info", "warning", "error")
"""The servers' line: time, level, component (the logger's name), message."""


def add_mount(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``graben mount`` (entry point ``graben.commands:mount``)."""
    summary = "Mount a store as a POSIX filesystem (FUSE)."
    parser = sub.add_parser("mount", help=summary, description=summary)
    _mount_arguments(parser)
    parser.set_defaults(run=_mount)


def add_umount(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``graben umount`` (entry point ``graben.commands:umount``)."""
    summary = "Unmount a graben mount."
    parser = sub.add_parser("umount", help=summary, description=summary)
    parser.add_argument("mountpoint", type=Path)
    parser.add_argument("-z", "--lazy", action="store_true", help="detach even if in use")
    parser.set_defaults(run=_umount)


def _mount_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = MountOptions()
    parser.add_argument("url", help=_URL_HELP)
    parser.add_argument("mountpoint", type=Path)
    parser.add_argument("-f", "--foreground", action="store_true", help="serve in this process")
    parser.add_argument("--read-only", action="store_true", help="refuse every change")
    parser.add_argument(
        "--spool", type=Path, default=defaults.spool_dir, help="where open files are staged"
    )
    parser.add_argument(
        "--spool-limit",
        type=_size,
        default=defaults.spool_limit,
        metavar="SIZE",
        help="what the spool may hold: bytes, or 512M, 50G, 1TiB "
        f"(default: {defaults.spool_limit >> 30} GiB)",
    )
    for flag, default, what in (
        ("--timeout", defaults.timeout, "the kernel caches names and attributes"),
        ("--wait", defaults.wait, "to keep trying to reach a cluster that is starting"),
    ):
        parser.add_argument(
            flag,
            type=float,
            default=default,
            metavar="S",
            help=f"seconds {what} (default: %(default)s)",
        )
    parser.add_argument("--log", type=Path, help="the daemon's log file")
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=defaults.log_level,
        help="least severe events logged (default: %(default)s)",
    )
    parser.add_argument(
        "--metrics",
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics",
    )
    parser.add_argument("--allow-other", action="store_true", help="let other users in")
    parser.add_argument(
        "--token-file", type=Path, metavar="FILE", help="a tenant's token (a 0600 file)"
    )
    parser.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:  # its message says what it takes; argparse's would not
        raise argparse.ArgumentTypeError(str(exc)) from None


def _options(args: argparse.Namespace) -> MountOptions:
    return MountOptions(
        read_only=args.read_only,
        spool_dir=args.spool,
        spool_limit=args.spool_limit,
        timeout=args.timeout,
        wait=args.wait,
        log_file=args.log,
        allow_other=args.allow_other,
        log_level=args.log_level,
        metrics=args.metrics,
        token_file=args.token_file,
    )


def _umount(args: argparse.Namespace) -> int:
    from ._mount import unmount

    unmount(args.mountpoint, lazy=args.lazy)
    return 0


def _mount(args: argparse.Namespace) -> int:
    from ._mount import mount, serve

    if args.ready_fd is not None:
        handler = logging.StreamHandler()
        # Several mounts share the spool's log: each line says whose it is.
        source = f"mount {args.mountpoint.absolute()} pid {os.getpid()}"
        handler.setFormatter(LogFormatter(source))
        logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
        serve(args.url, args.mountpoint.absolute(), _options(args), ready_fd=args.ready_fd)
        return 0
    pid = mount(args.url, args.mountpoint, _options(args), foreground=args.foreground)
    if pid is not None:
        print(f"mounted {args.url} on {args.mountpoint.absolute()} (daemon pid {pid})")
    return 0


def mount_main(argv: list[str] | None = None) -> int:
    """``graben mount`` on its own (what the background daemon runs)."""
    parser = argparse.ArgumentParser(prog="graben mount", allow_abbrev=False)
    _mount_arguments(parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    return _mount(args)
