"""A job's resource trace as one PNG among its plots: memory above, utilisation below.

matplotlib is imported here, on the tracer's thread when a traced job ends, never at the
launcher's start (Hydra's plugin scan must stay cheap) nor on its path that hands jobs out.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

from furcate_hydra.atomic import atomic_write_bytes
from furcate_hydra.tracing.samples import TraceSample

__all__ = ["plot_trace"]

# (panel title and unit, [(field, label)]): each panel shows the figures a job has
_PANELS = (
    ("memory (MiB)", (("rss_mb", "resident (RSS)"), ("gpu_mem_mb", "GPU"))),
    ("utilisation (%)", (("cpu_percent", "CPU (100 = one core)"), ("gpu_util_percent", "GPU"))),
)


def plot_trace(samples: Sequence[TraceSample], path: Path, title: str) -> None:
    """Draw ``samples`` against the job's elapsed time into ``path`` (written atomically)."""
    # Figure + the Agg canvas, never pyplot: no global backend switch, no figure registry
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # fixed margins and legend places: matplotlib's layout engines and its search for the
    # "best" legend place take a third of the time, on the launcher's process
    figure = Figure(figsize=(6.4, 5.0))
    FigureCanvasAgg(figure)
    figure.subplots_adjust(left=0.12, right=0.97, top=0.93, bottom=0.1, hspace=0.12)
    axes_pair = figure.subplots(2, 1, sharex=True)
    for axes, (unit, series) in zip(axes_pair, _PANELS, strict=True):
        top = 0.0
        for name, label in series:
            points = [(s.elapsed_s, getattr(s, name)) for s in samples]
            shown = [(x, y) for x, y in points if y is not None]
            if shown:
                axes.plot(*zip(*shown, strict=True), marker="o", markersize=2, label=label)
                top = max(top, *(y for _, y in shown))
        axes.set_ylabel(unit)
        axes.set_ylim(0, top * 1.3 or 1.0)  # headroom for the legend, in one row at the top
        axes.grid(alpha=0.3)
        if axes.lines:
            axes.legend(loc="upper left", ncol=2, frameon=False)
    axes_pair[0].set_title(title)
    axes_pair[-1].set_xlabel("seconds since the job started")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, buffer.getvalue(), durable=False)
