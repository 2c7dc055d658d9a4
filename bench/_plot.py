"""``--plot``: one bar group per workload, each bar a system's ratio to its baseline.

Ratios share one axis whatever the workloads' units; each bar is labelled
with its value and unit as well. Within a group graben's systems and the
peers measured beside them (JuiceFS, SeaweedFS, DCP's writers, LitData, ...)
stand side by side in colours of their own, the baseline in grey, and a
peer's durable twin (", then sync") hatched. Rendered with matplotlib's Agg canvas and no
pyplot, so nothing global changes and no display is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ._report import Rated

BASELINE_COLOR = "#9e9e9e"
GRABEN_COLOR = "#1f6fb4"
PEER_COLOR = "#e08214"
GRABEN_NAMES = ("graben", "Graben", "CachedDataset", "CachedLoader")
"""A system whose name holds one of these is graben's; any other is a peer."""


def _color(row: Rated) -> str:
    if row.result.is_baseline:
        return BASELINE_COLOR
    return GRABEN_COLOR if any(n in row.result.system for n in GRABEN_NAMES) else PEER_COLOR


def _rows(rated: Sequence[Rated]) -> list[tuple[str, Rated | None]]:
    """Top to bottom: a header row per workload (no bar), then one row per system."""
    rows: list[tuple[str, Rated | None]] = []
    previous = None
    for row in rated:
        if row.result.workload != previous:
            previous = row.result.workload
            rows.append((previous, None))
        rows.append((row.result.system, row))
    return rows


def _label(row: Rated) -> str:
    r = row.result
    figure = f"{r.value:.3g} {r.unit}"
    return f" {figure}" if row.ratio is None else f" {row.ratio:.2f}x  ({figure})"


def plot(rated: Sequence[Rated], path: Path, title: str) -> None:
    """Write the chart of ``rated`` to ``path`` (PNG)."""
    # Imported here: matplotlib is the optional "bench" extra and slow to import.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    rows = _rows(rated)
    fig = Figure(figsize=(10, 1.2 + 0.42 * len(rows)), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    widest = max([r.ratio for _, r in rows if r is not None and r.ratio is not None] + [1.0])
    for y, (_, row) in enumerate(rows):
        if row is None:
            continue
        ratio = row.ratio or 0.0
        hatch = "//" if row.result.system.endswith(", then sync") else None
        ax.barh(y, ratio, height=0.7, color=_color(row), hatch=hatch, edgecolor="white")
        ax.text(ratio, y, _label(row), va="center", fontsize=9)
    ax.set_yticks(range(len(rows)), [name for name, _ in rows])
    for tick, (_, row) in zip(ax.get_yticklabels(), rows, strict=True):
        tick.set_fontweight("bold" if row is None else "normal")
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", linestyle="--", linewidth=0.8)
    # Room on the right for the labels at the bars' ends.
    ax.set_xlim(0, widest * 1.45)
    ax.set_xlabel("ratio to the baseline measured in the same run (higher is more)")
    legend = [("graben", GRABEN_COLOR), ("peer", PEER_COLOR), ("baseline", BASELINE_COLOR)]
    handles = [Patch(color=color, label=label) for label, color in legend]
    handles.append(Patch(facecolor=PEER_COLOR, hatch="//", edgecolor="white", label="then sync"))
    ax.legend(handles=handles, loc="lower right", fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.savefig(path, dpi=120)
