"""The ``graben`` command: subcommands come from the ``graben.commands`` entry points.

Each entry point is named after its subcommand and loads a function
``add(subparsers) -> None`` that adds one parser and sets ``run`` on it:
``parser.set_defaults(run=fn)`` where ``fn(args) -> int`` is the exit code.
The store's own commands are registered the same way as every other
package's, so this module knows nothing of them. A door installed without its
extra fails to load with ``MissingExtra``: its command is still listed, with
the extra to install, and running it says so in one line (exit 2).

A command that calls ``config_arg(parser, section)`` takes ``--config FILE``:
the table ``[section]`` of that TOML file gives defaults for any of its flags
(flags on the command line win), applied here before the arguments are parsed.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points, version
from pathlib import Path
from typing import NoReturn, TypeAlias, cast

from rich.console import Console
from rich.text import Text

from .._errors import GrabenError, MissingExtra
from ._configfile import config_defaults, load_config
from ._logs import configure

GROUP = "graben.commands"
FAILED, USAGE, INTERRUPTED = 1, 2, 130
"""Exit codes besides 0 (docs/store.md "Exit codes"): the command failed (a store
error, bad input it read); it was called wrongly (argparse's code too; a bad
``--config``; a door not installed); Ctrl-C."""
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
Add = Callable[[Subparsers], None]


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``graben`` parser: every registered subcommand, or only ``command``'s.

    Loading one command's module only keeps ``graben ls`` from importing
    what ``graben ckpt`` needs (torch takes a second or two).
    """
    parser = _Parser(prog="graben", description="graben: storage for ML training clusters.")
    parser.add_argument("--version", action="version", version=f"graben {version('graben')}")
    # its parsers are _Parser too (argparse makes them of the parent's class)
    sub = cast(
        Subparsers, parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    )
    entries = sorted(entry_points(group=GROUP), key=lambda e: e.name)
    if any(e.name == command for e in entries):
        entries = [e for e in entries if e.name == command]
    for entry in entries:
        try:
            add: Add = entry.load()
            add(sub)
        except MissingExtra as exc:  # a door installed without its extra
            _not_installed(sub, entry.name, exc)
        except Exception as exc:  # one broken plug-in must not take every command down
            if isinstance(exc.__cause__, KeyboardInterrupt):  # Ctrl-C inside a class body
                raise exc.__cause__ from None
            _err(f"warning: command {entry.name!r} is unavailable ({entry.value}): {exc}")
    _whole_flags_only(parser)
    return parser


class _Parser(argparse.ArgumentParser):
    """argparse's parser (its subcommands' too), naming the closest command or choice
    when one is mistyped: ``graben lss`` says "did you mean 'ls'?"."""

    def error(self, message: str) -> NoReturn:
        found = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if found is not None:
            choices = re.findall(r"'([^']*)'", found.group(2))
            close = difflib.get_close_matches(found.group(1), choices, n=1, cutoff=0.6)
            if close:
                message = f"{message}; did you mean '{close[0]}'?"
        super().error(message)


def _whole_flags_only(parser: argparse.ArgumentParser) -> None:
    """No abbreviated flags, in any subcommand: ``--node 3`` must not run as ``--nodes 3``."""
    parser.allow_abbrev = False
    for sub in _subcommands(parser).values():
        _whole_flags_only(sub)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """``parser``'s subcommand parsers by name (none for a leaf)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(subs[0].choices) if subs else {}


def _not_installed(sub: Subparsers, name: str, missing: MissingExtra) -> None:
    """``name`` listed with the extra it needs; running it only says so (``main``)."""
    parser = sub.add_parser(name, help=missing.message, description=missing.message)
    parser.set_defaults(missing_extra=missing.message)


def _missing_extra(parser: argparse.ArgumentParser, argv: Sequence[str]) -> str | None:
    """What the command ``argv`` selects needs installed, if it is not."""
    missing: str | None = _leaf(parser, argv).get_default("missing_extra")
    return missing


def config_arg(parser: argparse.ArgumentParser, section: str) -> None:
    """Give ``parser`` a ``--config FILE`` whose ``[section]`` table holds defaults for
    its flags (keys named as the flags, without ``--``)."""
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help=f"TOML file whose [{section}] table sets any of these flags (flags given here win)",
    )
    parser.set_defaults(config_section=section)


def _leaf(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.ArgumentParser:
    """The (sub)command parser ``argv`` selects, following its subcommand names."""
    for token in argv:
        subs = _subcommands(parser)
        if not subs:
            break
        parser = subs.get(token, parser)
    return parser


def apply_config(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """If the command ``argv`` selects takes ``--config`` and is given one, its table
    becomes that command's defaults (before parsing: it may fill required flags)."""
    leaf = _leaf(parser, argv)
    section = leaf.get_default("config_section")
    if section is None:
        return
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config", type=Path, default=None)
    path: Path | None = pre.parse_known_args(argv)[0].config
    if path is not None:
        config_defaults(leaf, load_config(path, section), f"config file {path} [{section}]")


def _err(message: str) -> None:
    # Text, not markup: paths may hold "[" and messages must stay one line.
    Console(stderr=True, soft_wrap=True, highlight=False).print(Text(message, style="red"))


def describe(exc: GrabenError) -> str:
    """One line for a human: the message and the path it concerns."""
    return exc.message if exc.path is None else f"{exc.message}: {exc.path}"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``graben`` script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv[0] if argv else None)
    missing = _missing_extra(parser, argv)
    if missing is not None:
        _err(f"graben {argv[0]}: {missing}")
        return USAGE
    try:
        apply_config(parser, argv)
    except GrabenError as exc:
        _err(f"graben: {describe(exc)}")
        return USAGE
    args = parser.parse_args(argv)
    if getattr(args, "log_level", None) is not None:
        configure(args.log_level)
    try:
        code: int = args.run(args)
    except GrabenError as exc:
        _err(f"graben: {describe(exc)}")
        return FAILED
    except KeyboardInterrupt:
        said = getattr(args, "interrupted", "")
        fresh_line = "\n" if sys.stderr.isatty() else ""  # past a progress bar
        _err(f"{fresh_line}graben: interrupted{'; ' + said if said else ''}")
        return INTERRUPTED
    except BrokenPipeError:
        return 0
    return code
