"""``graben meta backup`` and ``graben meta restore``.

A command beside the engine, not a request the service answers: an operator
backs up what they can reach (the SQLite file's host, or any host with
``pg_dump`` and a login to the database), with the tools their other
backups use, whether or not a service is running, and the copy never passes
through the service's connections. The engine's own online copy keeps it
consistent while the services serve (``meta.engines._backup``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeAlias

Actions: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
ENGINE_HELP = "sqlite:///path/to/meta.db or postgresql://user@host:port/dbname"


def add_backup(actions: Actions) -> None:
    """``graben meta backup`` and ``graben meta restore``."""
    take = _action(
        actions,
        ("backup", "Back the metadata up while the services serve.", _backup),
        "Copy the metadata engine, consistent, while its services serve: SQLite with its "
        "online backup API, PostgreSQL with pg_dump (one REPEATABLE READ snapshot, custom "
        "format). The live store then keeps every chunk a file of the backup needs for "
        "--keep-days, even when the file is deleted: restore within that time.",
    )
    take.add_argument("out", type=Path, help="the backup file to write (must not exist)")
    take.add_argument(
        "--keep-days",
        type=float,
        default=7.0,
        help="days collection keeps the chunks this backup's files need (default 7)",
    )
    back = _action(
        actions,
        ("restore", "Restore the metadata from a backup (its services stopped).", _restore),
        "Bring a backup back into an engine whose services are stopped: a SQLite file (none "
        "there, or --replace), or a new, empty PostgreSQL database (pg_restore). The store "
        "keeps its id, so the same data nodes serve it; every file of the backup reads from "
        "the chunks they hold. Chunk files written after the backup are orphans: graben "
        "fsck --collect deletes them once older than the grace period.",
    )
    back.add_argument("backup", type=Path, help="a file written by graben meta backup")
    back.add_argument(
        "--replace",
        action="store_true",
        help="SQLite: set the database there aside (renamed beside it, not deleted)",
    )


def _action(
    actions: Actions, what: tuple[str, str, Callable[[argparse.Namespace], int]], about: str
) -> argparse.ArgumentParser:
    """One action: its name, its help and what runs it; its description; ``--engine``."""
    name, summary, run = what
    parser = actions.add_parser(name, help=summary, description=about)
    parser.add_argument("--engine", required=True, help=ENGINE_HELP)
    parser.set_defaults(run=run)
    return parser


def _backup(args: argparse.Namespace) -> int:
    from ..meta import backup

    done = backup(args.engine, args.out, keep_s=args.keep_days * 86400)
    until = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(done.until_ns / 1e9))
    print(f"backed up store {done.store_id} to {done.path}; its chunks are kept until {until}")
    return 0


def _restore(args: argparse.Namespace) -> int:
    from ..meta import restore

    done = restore(args.engine, args.backup, replace=args.replace)
    taken = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(done.taken_ns / 1e9))
    print(
        f"restored store {done.store_id} as it was at {taken}; start its services, then "
        "graben fsck --collect deletes the chunk files written since"
    )
    return 0
