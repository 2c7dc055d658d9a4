"""``graben bench``: run workloads, print the table, write ``--json`` and ``--plot``."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console

from graben.store import GrabenError, InvalidArgument, parse_size

from . import _runner
from ._machine import Machine, describe
from ._registry import discover, select
from ._report import Rated, rate, table, write_json

MiB = 1 << 20
GiB = 1 << 30
DEFAULT_GIB = 2.0
QUICK_GIB = 0.5

DESCRIPTION = """\
Measure graben beside its peers: every workload times graben and a baseline
in the same run, on the same bytes, and reports the ratio between them.
"""


def add_bench(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``bench`` subcommand (entry point ``graben.commands:bench``)."""
    parser = subparsers.add_parser(
        "bench", help="Measure graben beside its peers.", description=DESCRIPTION
    )
    parser.add_argument(
        "workloads",
        nargs="*",
        metavar="WORKLOAD",
        help="names, globs (read-*) or families (read) to run; default: all",
    )
    parser.add_argument("--list", action="store_true", help="list the workloads and exit")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=(
            f"small sizes ({QUICK_GIB:g} GiB unless a size is given) and short runs; "
            "every workload takes about 20 minutes even so: name the ones you want"
        ),
    )
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument(
        "--size",
        type=_bench_size,
        metavar="SIZE",
        help="what each sequential workload moves: GiB (2, 0.5) or a size (512M, 3GiB) "
        f"(default {DEFAULT_GIB:g} GiB)",
    )
    sizes.add_argument(
        "--size-mib", type=_positive(int), metavar="MIB", help="the same in MiB, for tiny runs"
    )
    parser.add_argument(
        "--repeat",
        type=_positive(int),
        default=1,
        metavar="N",
        help="trials per workload; each figure is the median of N (default 1)",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        metavar="DIR",
        help="make the scratch directory in DIR (default: the current directory); "
        "it is removed afterwards",
    )
    parser.add_argument(
        "--target",
        metavar="URL|DIR",
        help="measure a deployed cluster (graben://host:port: the cluster workloads) or any "
        "mounted directory (the mount workloads), starting nothing of the bench's own",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON")
    parser.add_argument("--plot", type=Path, metavar="FILE.png", help="draw the ratios as a PNG")
    parser.set_defaults(run=run)


def _positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, not {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def _bench_size(text: str) -> int:
    """``--size``: bytes; a bare number is GiB (``2``, ``0.5``), else a size (``512M``)."""
    try:
        gib = float(text)
    except ValueError:
        gib = None
    try:
        size = parse_size(text) if gib is None else int(gib * GiB) if gib < 1 << 20 else -1
    except ValueError as exc:  # parse_size's message says what it takes
        raise argparse.ArgumentTypeError(str(exc)) from None
    if size <= 0:  # nan, inf, 0 and below, a tiny fraction
        raise argparse.ArgumentTypeError(f"must be a positive size, not {text}")
    return size


PIPE_WIDTH = 1000
"""Columns the table may take when printed to a log or a pipe (it takes what it needs)."""


def wide_console(stderr: bool = False) -> Console:
    """Where the table (or, on stderr, the progress) goes: the terminal's width, or in a
    log or a pipe as wide as the rows are (never wrapped at 80 columns)."""
    out = Console(stderr=stderr)
    return out if out.is_terminal else Console(stderr=stderr, width=PIPE_WIDTH)


def run(args: argparse.Namespace) -> int:
    """Run the ``bench`` subcommand."""
    available = discover()
    out = wide_console()
    if args.list:
        for wl in available:
            out.print(f"[bold]{wl.name:<12}[/bold] {wl.summary}", highlight=False)
        return 0
    selected = select(available, args.workloads or _targeted(args.target))
    settings = _runner.Settings(
        size=_size(args), quick=args.quick, repeat=args.repeat, target=args.target
    )
    err = wide_console(stderr=True)
    started = time.monotonic()
    with _scratch_root(args.dir) as root:
        machine = describe(root)
        outcome = _runner.run(selected, settings, root, err)
    rated = rate(outcome.results)
    out.print(table(rated, _title(settings), machine.summary()))
    for name, reason in outcome.skipped:
        out.print(f"[yellow]skipped[/yellow] {name}: {reason}", highlight=False)
    _write_outputs(args, machine, rated, _title(settings))
    err.print(f"[dim]graben bench took {time.monotonic() - started:.1f} s[/dim]")
    return 0


def _targeted(target: str | None) -> list[str]:
    """The workloads a ``--target`` runs when none are named: a store's cluster
    workloads, a directory's mount workloads (none named and no target: all)."""
    if target is None:
        return []
    if target.startswith("graben://"):
        return ["cluster-*"]
    if not Path(target).is_dir():
        raise InvalidArgument(f"--target {target}: not a graben:// URL nor a directory")
    return ["mount-*"]


def _size(args: argparse.Namespace) -> int:
    if args.size_mib is not None:
        return int(args.size_mib) * MiB
    if args.size is not None:
        return int(args.size)
    return int((QUICK_GIB if args.quick else DEFAULT_GIB) * GiB)


def _title(settings: _runner.Settings) -> str:
    trials = f"median of {settings.repeat} trials" if settings.repeat > 1 else "1 trial"
    return f"graben bench: {settings.size / MiB:.0f} MiB per sequential workload, {trials}"


@contextmanager
def _scratch_root(parent: Path | None) -> Iterator[Path]:
    """A fresh directory on the disk being measured, removed afterwards.

    Not ``/tmp`` by default: it is often tmpfs, where fsync costs nothing.
    """
    where = parent if parent is not None else Path(os.getcwd())
    try:
        where.mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix=".graben-bench-", dir=where))
    except OSError as exc:
        message = f"cannot make a scratch directory: {exc.strerror}; use --dir"
        raise GrabenError(message, str(where)) from exc
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _write_outputs(
    args: argparse.Namespace, machine: Machine, rated: list[Rated], title: str
) -> None:
    if args.json is not None:
        write_json(args.json, machine, rated)
    if args.plot is not None:
        from ._plot import plot  # matplotlib only when asked for

        plot(rated, args.plot, f"{title}\n{machine.summary()}")
