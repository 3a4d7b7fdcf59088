"""The report's figures as PNG bytes: the return value against each swept parameter, and
every job's learning curve, one plot per metric.

Learning curves come from the runs' metric histories. The x axis is the epoch where every
job's points of a metric fall on distinct epochs (Lightning logs an ``epoch`` metric at each
step it logs), else MLflow's step.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from furcate_hydra.store.metric_history import MetricPoint
from furcate_hydra.store.sweep_snapshot import JobSnapshot, SweepJobStatus

__all__ = [
    "CURVE_SKIP_PREFIXES",
    "Figures",
    "Plot",
    "curve_plots",
    "return_value_plots",
    "swept_values",
]

History = Mapping[str, Sequence[MetricPoint]]
# metrics that are no learning curve: the resource trace (its own table) and the Optuna
# sweeper's copies of the monitored metric
CURVE_SKIP_PREFIXES = ("job/", "optuna.")
EPOCH = "epoch"
_MAX_LEGEND = 20
_NOT_IN_FILENAME = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class Plot:
    """One figure: ``stem`` names its PNG file, ``title`` its heading in the report."""

    stem: str
    title: str
    png: bytes


@dataclass
class Figures:
    """Plots, and sentences saying why something has none."""

    plots: list[Plot] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def return_value_plots(jobs: Sequence[JobSnapshot]) -> Figures:
    """A scatter of the return value (each number of it, for a tuple) against each swept
    parameter, one point per finished or skipped job."""
    figures = Figures()
    swept = swept_values(jobs)
    if not swept:
        figures.notes.append("No parameter differs between the jobs: nothing to plot against.")
        return figures
    results: dict[int, list[float]] = {}
    for job in jobs:
        numbers = _numbers(job.return_value) if _finished(job) else None
        if numbers is not None:
            results[job.job_num] = numbers
    if not results:
        figures.notes.append("No job returned a number (or a list of numbers) to plot.")
        return figures
    width = max(len(values) for values in results.values())
    for key, by_job in swept.items():
        for index in range(width):
            label = "return value" if width == 1 else f"return value [{index}]"
            points = [
                (by_job[num], values[index])
                for num, values in sorted(results.items())
                if num in by_job and index < len(values)
            ]
            stem = _stem(f"return_value_vs_{key}" + (f"_{index}" if width > 1 else ""))
            title = f"{label} against {key}"
            figures.plots.append(Plot(stem, title, _scatter(points, key, label)))
    return figures


def curve_plots(jobs: Sequence[JobSnapshot], histories: Mapping[str, History]) -> Figures:
    """One plot per metric with more than one point in some job, every job a line."""
    figures = Figures()
    curves: dict[str, list[tuple[JobSnapshot, Sequence[MetricPoint]]]] = {}
    for job in jobs:
        history = histories.get(job.run_id or "", {})
        for name, points in history.items():
            if name != EPOCH and not name.startswith(CURVE_SKIP_PREFIXES):
                curves.setdefault(name, []).append((job, points))
    curves = {
        name: lines for name, lines in sorted(curves.items()) if max(len(p) for _, p in lines) > 1
    }
    if not curves:
        figures.notes.append("No job logged a metric more than once: no learning curves.")
    used: set[str] = set()
    labels = _labels(jobs)
    for name, lines in curves.items():
        stem = _stem(f"curve_{name}")
        while stem in used:
            stem += "_"
        used.add(stem)
        epochs = _epoch_axes(lines, histories)
        png = _lines(name, lines, epochs, labels)
        figures.plots.append(Plot(stem, name, png))
    return figures


def _epoch_axes(
    lines: Sequence[tuple[JobSnapshot, Sequence[MetricPoint]]], histories: Mapping[str, History]
) -> dict[int, dict[int, float]] | None:
    """Per job, step → epoch, when every job's points of this metric sit on distinct epochs."""
    axes: dict[int, dict[int, float]] = {}
    for job, points in lines:
        epoch_at = {p.step: p.value for p in histories[job.run_id or ""].get(EPOCH, [])}
        if any(p.step not in epoch_at for p in points):
            return None
        if len({epoch_at[p.step] for p in points}) != len(points):
            return None
        axes[job.job_num] = epoch_at
    return axes


def _labels(jobs: Sequence[JobSnapshot]) -> dict[int, str]:
    """Each job's legend entry: its number and the values it was swept to."""
    swept = swept_values(jobs)
    labels = {}
    for job in jobs:
        num = job.job_num
        values = [f"{key}={by_job[num]}" for key, by_job in swept.items() if num in by_job]
        label = f"#{job.job_num} {' '.join(values or job.overrides)}"
        labels[job.job_num] = label if len(label) <= 48 else label[:47] + "…"
    return labels


def swept_values(jobs: Sequence[JobSnapshot]) -> dict[str, dict[int, str]]:
    """The overrides that differ between jobs: ``{key: {job_num: value}}``, in the order the
    keys first appear (``+key=`` and ``key=`` are the same key)."""
    values: dict[str, dict[int, str]] = {}
    for job in jobs:
        for override in job.overrides:
            key, found, value = override.lstrip("+~").partition("=")
            if found:
                values.setdefault(key, {})[job.job_num] = value
    return {key: by_job for key, by_job in values.items() if len(set(by_job.values())) > 1}


def _finished(job: JobSnapshot) -> bool:
    """Has the job a final result: it ran to its end, or its result was taken from a run (a
    pruned trial's value is an early stop's, not comparable)."""
    return job.status in (SweepJobStatus.FINISHED, SweepJobStatus.SKIPPED)


def _numbers(value: Any) -> list[float] | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return [float(value)] if math.isfinite(value) else None
    if isinstance(value, list | tuple) and value:
        numbers = [_numbers(v) for v in value]
        if all(n is not None and len(n) == 1 for n in numbers):
            return [n[0] for n in numbers if n is not None]
    return None


def _scatter(points: Sequence[tuple[str, float]], key: str, label: str) -> bytes:
    figure, axes = _figure()
    xs_text = [x for x, _ in points]
    ys = [y for _, y in points]
    numeric = _floats(xs_text)
    if numeric is not None:
        axes.scatter(numeric, ys, s=28, alpha=0.8)
        positive = [x for x in numeric if x > 0]
        if len(positive) == len(numeric) and max(positive) >= 100 * min(positive):
            axes.set_xscale("log")
    else:
        categories = list(dict.fromkeys(xs_text))
        where = {c: i for i, c in enumerate(categories)}
        # a small fixed spread keeps equal results at one category apart
        spread = [where[x] + 0.16 * ((i % 5) - 2) / 2 for i, x in enumerate(xs_text)]
        axes.scatter(spread, ys, s=28, alpha=0.8)
        rotation = 30 if len(categories) > 4 else 0
        axes.set_xticks(range(len(categories)), categories, rotation=rotation)
    axes.set_xlabel(key)
    axes.set_ylabel(label)
    axes.set_title(f"{label} against {key}")
    return _png(figure)


def _lines(
    name: str,
    lines: Sequence[tuple[JobSnapshot, Sequence[MetricPoint]]],
    epochs: Mapping[int, Mapping[int, float]] | None,
    labels: Mapping[int, str],
) -> bytes:
    from matplotlib import colormaps
    from matplotlib.ticker import MaxNLocator

    figure, axes = _figure()
    palette = colormaps["tab10" if len(lines) <= 10 else "viridis"]
    for index, (job, points) in enumerate(lines):
        if epochs is not None:
            xs = [epochs[job.job_num][p.step] for p in points]
        else:
            xs = [float(p.step) for p in points]
        color = palette(index if len(lines) <= 10 else index / max(len(lines) - 1, 1))
        marker = "o" if len(points) <= 30 else None
        ys = [p.value for p in points]
        axes.plot(xs, ys, marker=marker, markersize=3, color=color, label=labels[job.job_num])
    axes.set_xlabel("epoch" if epochs is not None else "step")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_ylabel(name)
    axes.set_title(f"{name} ({len(lines)} of {len(labels)} jobs)")
    if len(lines) <= _MAX_LEGEND:
        axes.legend(fontsize="small", loc="best")
    return _png(figure)


def _figure() -> tuple[Any, Any]:
    # Figure + the Agg canvas, never pyplot: no global backend switch, no figure registry
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4, 4.0), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.grid(alpha=0.3)
    return figure, axes


def _png(figure: Any) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def _floats(texts: Sequence[str]) -> list[float] | None:
    try:
        return [float(text) for text in texts]
    except ValueError:
        return None


def _stem(text: str) -> str:
    return _NOT_IN_FILENAME.sub("_", text).strip("_") or "figure"
