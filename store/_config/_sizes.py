"""Sizes as people write them (``"50G"``): the command line's flags, ``graben.store.parse_size``;
and sizes and ages as people read them (``human_size``, ``ago``: the CLI's and the
status page's).

Pure: no I/O.
"""

from __future__ import annotations

import re

from .._errors import InvalidArgument

_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}
_SIZE = re.compile(r"\s*(\d+)(?:\.(\d+))?\s*(?:([kmgtp])(?:i?b)?|b)?\s*", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """Bytes in ``text``: a plain count (``"4096"``) or a number with a binary unit.

    ``K``, ``M``, ``G``, ``T``, ``P`` (also ``KiB``, ``MB``, ...) are powers of
    1024, as in ``df -h`` and ``dd``: ``"50G"`` is 50 GiB, ``"1.5M"`` 1,572,864.
    Anything else is ``InvalidArgument`` (a ``ValueError``) naming what was given.
    """
    if isinstance(text, int) and text >= 0:
        return text
    match = _SIZE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise InvalidArgument(f"not a size: {text!r} (say 4096, 512K, 256MiB, 50G or 1T)")
    whole, fraction, unit = match.group(1), match.group(2) or "", (match.group(3) or "").lower()
    scale = 1 << (10 * _POWERS[unit])
    tenths: int = 10 ** len(fraction)
    return int(whole) * scale + int(fraction or "0") * scale // tenths


_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_size(size: int) -> str:
    """``1536`` -> ``"1.5 KiB"``: binary units, one decimal above bytes."""
    value, unit = float(size), 0
    while value >= 1024 and unit < len(_UNITS) - 1:
        value, unit = value / 1024, unit + 1
    return f"{size} B" if unit == 0 else f"{value:.1f} {_UNITS[unit]}"


def ago(seconds: float) -> str:
    """``"40 s ago"``, ``"12 min ago"``, ``"5 h ago"``, ``"3 d ago"``."""
    for unit, length in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * length:
            return f"{seconds // length:.0f} {unit} ago"
    return f"{max(seconds, 0):.0f} s ago"
