"""Storage classes: how a file's chunks are kept once it is closed and old enough.

A class is named by text, the same everywhere (``graben class set``, the
Python API, ``stat --json``, the engine's ``classes`` table):

- ``replicated``: chunks stay as written, full copies on distinct racks (the
  writer's ``replication``); set on a subtree, it excepts it from its directory's class;
- ``ec:K+M``: each chunk cut into K data pieces plus M parity pieces (Reed-Solomon),
  each on its own node, racks first: any K of the K+M pieces give the chunk back;
- ``s3``: each chunk an object in the cluster's S3 tier (``--s3-tier``), read
  through the data nodes, which keep a cache of what they read;

either followed by ``@AGE`` (``ec:6+3@1h``): convert only files unchanged for that
long (``s``, ``m``, ``h``, ``d``; default: at once). ``parse`` reads it and
``StorageClass.name`` writes it back in one canonical form.

Pure: no I/O.
"""

from __future__ import annotations

import re

import msgspec

from .._errors import InvalidArgument

MAX_PIECES = 32
"""Most pieces (K + M) one stripe may have: zfec's limit is 256, racks run out long before."""
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_FORM = re.compile(r"(replicated|s3)|(ec):([0-9]+)\+([0-9]+)")


class StorageClass(msgspec.Struct, frozen=True):
    """A class as a value (see the module's docstring for its text)."""

    kind: str
    """``"replicated"``, ``"ec"`` or ``"s3"``."""
    k: int = 0
    """Data pieces per chunk (``ec``)."""
    m: int = 0
    """Parity pieces per chunk (``ec``): how many nodes may be lost."""
    after_s: int = 0
    """Seconds a file must be unchanged before it is converted."""

    @property
    def name(self) -> str:
        """The canonical text: ``ec:6+3``, ``ec:6+3@1h``, ``replicated``."""
        base = f"ec:{self.k}+{self.m}" if self.kind == "ec" else self.kind
        return base + (f"@{_age(self.after_s)}" if self.after_s else "")


def parse(text: str) -> StorageClass:
    """The class ``text`` names; ``InvalidArgument`` saying what is wrong, else."""
    base, at, age = text.strip().partition("@")
    form = _FORM.fullmatch(base)
    if form is None:
        raise InvalidArgument(
            f"unknown storage class {text!r}: expected ec:K+M, s3 or replicated, "
            "optionally with @AGE (ec:6+3@1h)"
        )
    after = _seconds(age, text) if at else 0
    if form.group(1):
        return StorageClass(form.group(1), after_s=after)
    k, m = int(form.group(3)), int(form.group(4))
    if k < 1 or m < 1 or k + m > MAX_PIECES:
        raise InvalidArgument(f"{text!r}: need K >= 1, M >= 1 and K + M <= {MAX_PIECES}")
    return StorageClass("ec", k=k, m=m, after_s=after)


def check_class(text: str) -> str:
    """The canonical name of the class ``text`` names; ``InvalidArgument`` if none."""
    return parse(text).name


def _seconds(age: str, text: str) -> int:
    found = re.fullmatch(r"([0-9]+)([smhd]?)", age)
    if found is None:
        raise InvalidArgument(f"{text!r}: the age after @ is a number with s, m, h or d")
    return int(found.group(1)) * _UNITS[found.group(2) or "s"]


def _age(seconds: int) -> str:
    for unit in "dhm":
        if seconds % _UNITS[unit] == 0:
            return f"{seconds // _UNITS[unit]}{unit}"
    return f"{seconds}s"
