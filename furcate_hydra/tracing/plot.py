"""A job's resource trace as one PNG among its plots: memory above, utilisation below.

matplotlib is imported here, on the tracer's thread when the first traced job ends, never at
the launcher's start (Hydra's plugin scan must stay cheap) nor on its path that hands jobs out.
The plot costs the launcher's process CPU for every traced job, so one figure is drawn again
and again: setting up a figure and its axes is half the cost of drawing a fresh one.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from furcate_hydra.atomic import atomic_write_bytes
from furcate_hydra.tracing.samples import TraceSample

__all__ = ["TracePlotter"]

# (panel's unit, [(field, label)]): each panel shows the figures a job has
_PANELS = (
    ("memory (MiB)", (("rss_mb", "resident (RSS)"), ("gpu_mem_mb", "GPU"))),
    ("utilisation (%)", (("cpu_percent", "CPU (100 = one core)"), ("gpu_util_percent", "GPU"))),
)


class TracePlotter:
    """Draws traces into PNGs with one figure, made on first use; one thread uses it."""

    def __init__(self) -> None:
        self._figure: Any = None
        self._panels: list[tuple[Any, list[Any]]] = []  # (axes, its lines)
        self._title: Any = None

    def plot(self, samples: Sequence[TraceSample], path: Path, title: str) -> None:
        """Draw ``samples`` against the job's elapsed time into ``path`` (written atomically)."""
        if self._figure is None:
            self._make_figure()
        for (axes, lines), (_, series) in zip(self._panels, _PANELS, strict=True):
            top = 0.0
            for line, (name, _) in zip(lines, series, strict=True):
                shown = [(s.elapsed_s, v) for s in samples if (v := getattr(s, name)) is not None]
                line.set_data([x for x, _ in shown], [y for _, y in shown])
                line.set_visible(bool(shown))
                top = max([top, *(y for _, y in shown)])
            axes.relim(visible_only=True)
            axes.autoscale_view(scaley=False)
            axes.set_ylim(0, top * 1.3 or 1.0)  # headroom for the legend, in one row at the top
            visible = [line for line in lines if line.get_visible()]
            axes.legend(handles=visible, loc="upper left", ncol=2, frameon=False)
        self._title.set_text(title)
        buffer = io.BytesIO()
        self._figure.savefig(buffer, format="png", dpi=100)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, buffer.getvalue(), durable=False)

    def _make_figure(self) -> None:
        # Figure + the Agg canvas, never pyplot: no global backend switch, no figure registry
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        figure = Figure(figsize=(6.4, 5.0))
        FigureCanvasAgg(figure)
        # fixed margins: matplotlib's layout engines would cost a third more per plot
        figure.subplots_adjust(left=0.12, right=0.97, top=0.93, bottom=0.1, hspace=0.12)
        axes_pair = figure.subplots(2, 1, sharex=True)
        for axes, (unit, series) in zip(axes_pair, _PANELS, strict=True):
            lines = [
                axes.plot([], [], marker="o", markersize=2, label=label)[0] for _, label in series
            ]
            axes.set_ylabel(unit)
            axes.grid(alpha=0.3)
            self._panels.append((axes, lines))
        axes_pair[-1].set_xlabel("seconds since the job started")
        self._title = axes_pair[0].set_title("")
        self._figure = figure
