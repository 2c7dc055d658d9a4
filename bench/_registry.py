"""Workloads and what they measure: the registry every bench module adds to.

A workload is a function ``fn(ctx) -> Iterable[Result]`` registered under a
name with ``@workload(name, summary)``. One call is one trial: it measures
graben and its baseline side by side, in the same run, on the same bytes, and
returns one ``Result`` per system. The workload modules, one per door in
``_workloads/``, are imported by ``discover()`` in the order listed in
``WORKLOAD_MODULES``, so a new door adds its workloads with one module and
one name in that list.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

from graben.store import InvalidArgument

if TYPE_CHECKING:
    from ._context import Context

WORKLOAD_MODULES = (
    *(
        "store",
        "sealed",
        "cluster",
        "tenants",
        "latency",
        "tls",
        "faults",
        "classes",
        "collect",
        "fsspec",
        "checkpoint",
        "memory",
        "fuse",
        "mounts",
        "tools",
        "dataset",
    ),
)
"""The modules of ``graben.bench._workloads``, in run order: the store core, the
cluster (plaintext, its metadata engine at a distance, TLS, then its faults), then each door
(the doors' workloads reuse the cluster's and S3's helpers)."""


@dataclass(frozen=True, slots=True)
class Result:
    """One system's figure in one workload."""

    workload: str
    """Name of the workload that measured it."""
    system: str
    """What was measured, e.g. ``graben embedded`` or ``plain write+fsync``."""
    value: float
    """The figure, in ``unit``."""
    unit: str
    """Unit of ``value``, e.g. ``GB/s`` (decimal gigabytes)."""
    baseline: str
    """The system of the same workload that ratios are taken against (itself for the baseline)."""

    def __post_init__(self) -> None:
        if not (self.workload and self.system and self.baseline):
            raise ValueError("a result needs a workload, a system and a baseline")
        if not math.isfinite(self.value):
            raise ValueError(f"{self.workload}/{self.system}: value {self.value} is not finite")

    @property
    def is_baseline(self) -> bool:
        """Whether this row is the one the others are compared with."""
        return self.system == self.baseline


class Skip(Exception):
    """Raised by a workload that cannot run here; the message says why."""


Run = Callable[["Context"], Iterable[Result]]


@dataclass(frozen=True, slots=True)
class Workload:
    """A registered workload."""

    name: str
    """Its name on the command line (``graben bench NAME``)."""
    summary: str
    """One line for ``graben bench --list``."""
    run: Run
    """One trial: returns a ``Result`` per system measured."""


_registry: dict[str, Workload] = {}


def workload(name: str, summary: str) -> Callable[[Run], Run]:
    """Register the decorated function as workload ``name``."""

    def register(fn: Run) -> Run:
        if name in _registry:
            raise ValueError(f"workload {name!r} is registered twice")
        _registry[name] = Workload(name, summary, fn)
        return fn

    return register


def discover() -> list[Workload]:
    """Import every workload module of the bench; all workloads in run order.

    Modules are imported in the order of ``WORKLOAD_MODULES``, and each lists
    its workloads in the order it defines them, so a module can rely on that
    order (reads after the write that produced their files).
    """
    for name in WORKLOAD_MODULES:
        importlib.import_module(f"{__package__ or 'graben.bench'}._workloads.{name}")
    return list(_registry.values())


def matches(name: str, pattern: str) -> bool:
    """Whether ``pattern`` selects workload ``name``.

    A pattern is a name, a glob (``read-*``) or a family prefix: ``read``
    selects ``read-warm`` and ``read-cold`` (``select`` takes a workload's whole
    name as that workload alone).
    """
    return fnmatchcase(name, pattern) or name.startswith(f"{pattern}-")


def select(available: Sequence[Workload], patterns: Sequence[str]) -> list[Workload]:
    """The workloads ``patterns`` select (all if none), in run order.

    Raises ``InvalidArgument`` naming any pattern that selects nothing.
    """
    if not patterns:
        return list(available)
    unmatched = [p for p in patterns if not any(matches(w.name, p) for w in available)]
    if unmatched:
        known = ", ".join(w.name for w in available)
        raise InvalidArgument(f"no workload matches {', '.join(unmatched)} (known: {known})")
    names = {w.name for w in available}

    def picks(name: str, pattern: str) -> bool:  # a whole name: mount-read is not -warm too
        return name == pattern if pattern in names else matches(name, pattern)

    return [w for w in available if any(picks(w.name, p) for p in patterns)]
