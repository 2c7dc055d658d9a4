"""Logging for the servers, configured once per process by the ``graben`` command.

One line per event on stderr: ``2026-11-24 06:30:01.123 WARNING graben.meta: ...``
(time, level, component: the logger's name). A command that takes
``--log-level`` (``log_arg``) has it applied by ``cli/_main.py`` before it runs.

The same event over and over (one logger, one message template, one level)
is written once per ``REPEAT_S``: the first line, then nothing until the
interval is over, when the next one carries ``(repeated N times in the last
10 s)``. A burst that stops leaves its count unsaid; the first line said
what happened.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable

LEVELS = ("debug", "info", "warning", "error")
REPEAT_S = 10.0
FORMAT = "%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


def log_arg(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` ``--log-level``."""
    parser.add_argument(
        "--log-level",
        choices=LEVELS,
        default="info",
        help="least severe events written to stderr (default: info)",
    )


class Repeats(logging.Filter):
    """Lets through the first of a run of alike records per interval, and with the
    next one after it, how many it held back."""

    def __init__(
        self, interval: float = REPEAT_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.interval, self.clock = interval, clock
        self._seen: dict[tuple[str, int, str], tuple[float, int]] = {}
        """(logger, level, template) -> (when its interval began, records held back)."""

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, str(record.msg))
        now = self.clock()
        began, held = self._seen.get(key, (-self.interval, 0))
        if now - began < self.interval:
            self._seen[key] = (began, held + 1)
            return False
        self._seen[key] = (now, 0)
        if held:
            record.msg = f"{record.msg} (repeated {held} times in the last {self.interval:g} s)"
        return True


class LogFormatter(logging.Formatter):
    """graben's log lines: one per record, with control characters in its message
    escaped (``\\n``), so a name a client or a user chose (a path, a mount point)
    cannot forge a line of its own; a traceback follows as it is. ``source`` goes
    before the logger's name (escaped too): the mount daemon's ``mount POINT pid N``,
    as several mounts share one log."""

    def __init__(self, source: str = "") -> None:
        said = escaped(source).replace("%", "%%") + " " if source else ""
        super().__init__(FORMAT.replace("%(name)s", said + "%(name)s"), DATE_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escaped(record.message)
        return super().formatMessage(record)


def escaped(text: str) -> str:
    """``text`` with each control (non-printable) character but a space as Python writes
    it in a string (``\\n``, ``\\x1b``)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def configure(level: str = "info", *, interval: float = REPEAT_S) -> None:
    """Send the process's log records at ``level`` and above to stderr, one line each,
    repeats held back. Calling it again replaces the earlier setup."""
    if level not in LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(LEVELS)}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogFormatter())
    handler.addFilter(Repeats(interval))
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "graben", False)]:
        root.removeHandler(old)
    handler.graben = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level.upper())
