"""Servers' flags from a TOML file (``--config``): ``load_config`` reads one table
of it and ``config_defaults`` makes that table a command's defaults, so flags
given on the command line still win.
"""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._errors import InvalidArgument, NotFound


def load_config(path: Path, section: str) -> dict[str, Any]:
    """The table ``[section]`` of the TOML file at ``path`` (empty if it has none)."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise NotFound("no such config file", str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"cannot read config file {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgument(f"config file {path} is not valid TOML: {exc}") from None
    table = data.get(section, {})
    if not isinstance(table, dict):
        raise InvalidArgument(f"config file {path}: [{section}] must be a table")
    return table


def config_defaults(parser: argparse.ArgumentParser, values: Mapping[str, Any], where: str) -> None:
    """Make ``values`` the defaults of ``parser``'s flags (keys are flag names without
    ``--``; ``_`` may stand for ``-``). Every key must name one of its flags, and each
    value passes the flag's own type check; a flag given a value here is no longer
    required. ``where`` names the file and table in errors."""
    flags = _long_flags(parser)
    for key, value in values.items():
        action = flags.get(key.replace("_", "-"))
        if action is None:
            known = ", ".join(sorted(flags))
            raise InvalidArgument(f"{where}: unknown key {key!r} (known: {known})")
        parser.set_defaults(**{action.dest: _flag_value(action, value, f"{where}: {key}")})
        action.required = False


def _long_flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The parser's ``--name`` flags by name, but the config file's own and help."""
    return {
        option[2:]: action
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--") and option not in ("--config", "--help")
    }


def _flag_value(action: argparse.Action, value: Any, where: str) -> Any:
    """``value`` as the flag would parse it from the command line."""
    if action.nargs == 0:  # a switch such as --init: true or false
        if not isinstance(value, bool):
            raise InvalidArgument(f"{where} must be true or false, not {value!r}")
        return action.const if value else action.default
    if isinstance(value, list):
        if action.nargs not in ("*", "+") and not isinstance(action, argparse._AppendAction):
            raise InvalidArgument(f"{where} takes one value, not a list")
        return [_one_value(action, v, where) for v in value]
    return _one_value(action, value, where)


def _one_value(action: argparse.Action, value: Any, where: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise InvalidArgument(f"{where} must be a string or a number, not {value!r}")
    convert = action.type if callable(action.type) else str
    try:
        parsed = convert(str(value))
    except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
        raise InvalidArgument(f"{where}: {value!r} is not valid ({exc})") from None
    if action.choices is not None and parsed not in action.choices:
        raise InvalidArgument(f"{where} must be one of {', '.join(map(str, action.choices))}")
    return parsed
