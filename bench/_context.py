"""What a workload receives: where to work, how much to move, how to show progress."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Protocol, TypeVar, cast

from rich.console import Console

T = TypeVar("T")

Advance = Callable[[int], None]
"""Reports that ``n`` more units of a step are done."""


class Steps(Protocol):
    """Shows the steps of a trial while they run."""

    def step(self, label: str, total: int) -> AbstractContextManager[Advance]:
        """A progress line for ``label`` out of ``total`` units, shown while the block runs."""


Fixture = Callable[["Context"], AbstractContextManager[T]]
"""Makes a shared value: a context manager factory, entered once per run."""


class Fixtures:
    """Values made on first use, shared by every trial of a run, released at its end.

    Use as a context manager: leaving it exits every fixture, newest first.
    """

    def __init__(self) -> None:
        self._made: dict[Fixture[object], object] = {}
        self._stack = ExitStack()

    def get(self, make: Fixture[T], ctx: Context) -> T:
        """The value ``make`` produced for this run, making it now if needed."""
        if make not in self._made:
            self._made[make] = self._stack.enter_context(make(ctx))
        return cast(T, self._made[make])

    def __enter__(self) -> Fixtures:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._made.clear()
        self._stack.close()


@dataclass(frozen=True, slots=True, kw_only=True)
class Context:
    """One trial's surroundings; ``step`` and ``fixture`` are the calls workloads make."""

    scratch: Path
    """An empty directory of this trial's own, removed after the trial."""
    shared: Path
    """A directory kept for the whole run: files that several workloads use live here."""
    size: int
    """Bytes each sequential workload moves."""
    quick: bool
    """Whether the user asked for small sizes and short runs (``--quick``)."""
    trial: int
    """Index of this trial from 0 (alternate the order of systems with it)."""
    console: Console
    """Where to print notes (stderr); progress goes through ``step``."""
    steps: Steps
    """Progress display behind ``step``."""
    fixtures: Fixtures
    """Run-wide values behind ``fixture``."""
    target: str | None = None
    """``--target``: a deployed cluster's URL (``graben://...``) or a mounted directory;
    workloads measure it instead of starting systems of their own."""

    @property
    def target_url(self) -> str | None:
        """The target, if it is a store URL."""
        return self.target if self.target and self.target.startswith("graben://") else None

    @property
    def target_path(self) -> Path | None:
        """The target, if it is a directory."""
        return Path(self.target) if self.target and not self.target_url else None

    def step(self, label: str, total: int) -> AbstractContextManager[Advance]:
        """Show ``label`` with a progress bar of ``total`` units while the block runs."""
        return self.steps.step(label, total)

    def fixture(self, make: Fixture[T]) -> T:
        """The run's value from ``make`` (files it creates belong under ``shared``)."""
        return self.fixtures.get(make, self)
