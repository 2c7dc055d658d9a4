"""Running workloads: trials, their scratch directories, progress, and the median."""

from __future__ import annotations

import shutil
import statistics
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)

from ._context import Advance, Context, Fixtures
from ._registry import Result, Skip, Workload


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """How much each workload does."""

    size: int
    """Bytes each sequential workload moves."""
    quick: bool
    """Whether the run should be short (``--quick``: small sizes, fewer repeats)."""
    repeat: int
    """Trials per workload; each system's figure is the median of its trials."""
    target: str | None = None
    """A deployed cluster's URL or a mounted directory to measure, starting nothing."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a run measured."""

    results: tuple[Result, ...]
    """One row per system per workload, medians over the trials, in run order."""
    skipped: tuple[tuple[str, str], ...]
    """(workload, reason) for each workload that could not run here."""


class RichSteps:
    """``Steps`` as transient rich progress bars."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress

    @contextmanager
    def step(self, label: str, total: int) -> Iterator[Advance]:
        task = self._progress.add_task(label, total=total)

        def advance(n: int) -> None:
            self._progress.advance(task, n)

        try:
            yield advance
        finally:
            self._progress.remove_task(task)


def run(workloads: Sequence[Workload], settings: Settings, root: Path, console: Console) -> Outcome:
    """Run each workload ``settings.repeat`` times in ``root``, showing progress on ``console``."""
    (root / "shared").mkdir(parents=True, exist_ok=True)
    results: list[Result] = []
    skipped: list[tuple[str, str]] = []
    with _progress(console) as progress, Fixtures() as fixtures:
        trials = _Trials(progress, settings.repeat, root / "trials", len(workloads))
        base = Context(
            scratch=root,
            shared=root / "shared",
            size=settings.size,
            quick=settings.quick,
            target=settings.target,
            trial=0,
            console=progress.console,
            steps=RichSteps(progress),
            fixtures=fixtures,
        )
        for wl in workloads:
            try:
                samples = trials.run(wl, base)
            except Skip as exc:
                skipped.append((wl.name, str(exc)))
                progress.console.print(f"[yellow]skipped[/yellow] {wl.name}: {exc}")
                continue
            rows = combine(wl.name, samples)
            results.extend(rows)
            progress.console.print(_summary(wl.name, rows, samples), highlight=False)
    return Outcome(tuple(results), tuple(skipped))


def _progress(console: Console) -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        refresh_per_second=4,  # the bench shares the CPU with what it measures
    )


class _Trials:
    """Runs the trials of one workload after another, with an overall progress line."""

    def __init__(self, progress: Progress, repeat: int, root: Path, workloads: int) -> None:
        self._progress, self._repeat, self._root = progress, repeat, root
        self._count = workloads
        self._overall = progress.add_task("bench", total=workloads * repeat)
        self._done = 0

    def run(self, wl: Workload, base: Context) -> list[list[Result]]:
        """The results of every trial of ``wl``; ``Skip`` propagates."""
        samples: list[list[Result]] = []
        self._done += 1
        try:
            for trial in range(self._repeat):
                self._show(wl, trial)
                with _scratch(self._root / f"{wl.name}-{trial}") as scratch:
                    samples.append(list(wl.run(replace(base, scratch=scratch, trial=trial))))
                self._progress.advance(self._overall)
        finally:
            # A skipped or failed workload still counts as done for the overall bar.
            self._progress.update(self._overall, completed=self._done * self._repeat)
        return samples

    def _show(self, wl: Workload, trial: int) -> None:
        where = f"[{self._done}/{self._count}] {wl.name}"
        self._progress.update(
            self._overall, description=f"{where} (trial {trial + 1}/{self._repeat})"
        )


@contextmanager
def _scratch(path: Path) -> Iterator[Path]:
    path.mkdir(parents=True)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def combine(workload: str, samples: Sequence[Sequence[Result]]) -> list[Result]:
    """One row per system: the median value over the trials, systems in first-seen order.

    The median rather than the best: it is robust to one lucky or unlucky
    trial in either direction, whatever the unit (a rate or a latency).
    """
    first: dict[str, Result] = {}
    values: dict[str, list[float]] = {}
    for result in (r for trial in samples for r in trial):
        _check(workload, first.setdefault(result.system, result), result)
        values.setdefault(result.system, []).append(result.value)
    return [replace(r, value=statistics.median(values[s])) for s, r in first.items()]


def _check(workload: str, first: Result, result: Result) -> None:
    if result.workload != workload:
        raise ValueError(f"workload {workload!r} returned a result of {result.workload!r}")
    if (result.unit, result.baseline) != (first.unit, first.baseline):
        raise ValueError(f"{workload}/{result.system}: unit or baseline changed between trials")


def _summary(workload: str, rows: Sequence[Result], samples: Sequence[Sequence[Result]]) -> str:
    """The medians, and each system's range when there were several trials."""
    values: dict[str, list[float]] = {}
    for result in (r for trial in samples for r in trial):
        values.setdefault(result.system, []).append(result.value)
    figures = []
    for r in rows:
        seen = values[r.system]
        spread = f" ({min(seen):.3g}-{max(seen):.3g})" if len(seen) > 1 else ""
        figures.append(f"{r.system} {r.value:.3g}{spread} {r.unit}")
    return f"[green]done[/green] {workload}: {', '.join(figures)}"
