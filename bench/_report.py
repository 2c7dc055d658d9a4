"""The report: ratios to the baseline, the terminal table, the JSON document."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from ._machine import Machine
from ._registry import Result


@dataclass(frozen=True, slots=True)
class Rated:
    """A result with its ratio to the baseline measured in the same run."""

    result: Result
    """The measurement."""
    ratio: float | None
    """``value`` over the baseline's ``value``; ``None`` if that row is missing or zero."""


def rate(results: Sequence[Result]) -> list[Rated]:
    """Each result with its ratio to its workload's named baseline row."""
    rows = {(r.workload, r.system): r for r in results}
    return [Rated(r, _ratio(r, rows.get((r.workload, r.baseline)))) for r in results]


def _ratio(result: Result, baseline: Result | None) -> float | None:
    if baseline is None or baseline.value == 0:
        return None
    return result.value / baseline.value


def table(rated: Sequence[Rated], title: str | None = None, caption: str | None = None) -> Table:
    """The rich table shown on the terminal."""
    out = Table(title=title, caption=caption, caption_justify="left")
    out.add_column("workload")
    out.add_column("system")
    out.add_column("value", justify="right")
    out.add_column("unit")
    out.add_column("ratio", justify="right")
    previous = None
    for row in rated:
        r = row.result
        name = r.workload if r.workload != previous else ""
        previous = r.workload
        system = f"{r.system} [dim](baseline)[/dim]" if r.is_baseline else r.system
        out.add_row(name, system, f"{r.value:.3g}", r.unit, _format_ratio(row.ratio))
    return out


def _format_ratio(ratio: float | None) -> str:
    if ratio is None:
        return "n/a"
    return f"{ratio:.2f}x" if ratio >= 0.1 else f"{ratio:.2g}x"  # 0.0024x, not 0.00x


def document(machine: Machine, rated: Sequence[Rated]) -> dict[str, Any]:
    """The ``--json`` document: ``{"machine": {...}, "results": [...]}``."""
    return {
        "machine": dataclasses.asdict(machine),
        "results": [{**dataclasses.asdict(row.result), "ratio": row.ratio} for row in rated],
    }


def write_json(path: Path, machine: Machine, rated: Sequence[Rated]) -> None:
    """Write the ``--json`` document to ``path``."""
    text = json.dumps(document(machine, rated), indent=2)
    path.write_text(text + "\n", encoding="utf-8")
