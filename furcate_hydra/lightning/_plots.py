"""Learning curves from a metrics history: one PNG per metric family, train and val together."""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

# Figure + the Agg canvas, never pyplot: no global backend switch, no figure registry to leak
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from furcate_hydra.atomic import atomic_write_bytes
from furcate_hydra.layout import JobPaths

__all__ = ["PLOTS_DIR", "metric_families", "plot_history", "split_metric_name"]

PLOTS_DIR = JobPaths.PLOTS

_SPLITS = {
    "train": "train",
    "training": "train",
    "val": "val",
    "valid": "val",
    "validation": "val",
    "test": "test",
}
_SPLIT_ORDER = {"train": 0, "val": 1, "test": 2}
_NOT_IN_FILENAME = re.compile(r"[^A-Za-z0-9_.-]+")


def split_metric_name(name: str) -> tuple[str, str | None]:
    """``(family, split)`` of a metric name; split is None when the name has no split in it.

    ``train_loss``, ``train/loss``, ``loss/train`` and ``train_loss_epoch`` are all
    ``("loss", "train")``; ``val``, ``valid`` and ``validation`` are all ``"val"``.
    """
    base = name.removesuffix("_epoch") or name
    for sep in ("/", "_", "-"):
        head, found, tail = base.partition(sep)
        if found and tail and head.lower() in _SPLITS:
            return tail, _SPLITS[head.lower()]
    head, found, tail = base.rpartition("/")
    if found and head and tail.lower() in _SPLITS:
        return head, _SPLITS[tail.lower()]
    return base, None


def metric_families(names: Iterable[str]) -> dict[str, dict[str, str]]:
    """Group metric names into ``{family: {label: metric name}}``, train before val.

    The label is the split, or the metric's own name when it has none. Where two names give the
    same family and split (``train_loss`` and ``train_loss_epoch``), the first in sorted order wins.
    """
    families: dict[str, dict[str, str]] = {}
    for name in sorted(set(names)):
        family, split = split_metric_name(name)
        families.setdefault(family, {}).setdefault(split or name, name)
    return {
        family: dict(sorted(series.items(), key=lambda kv: (_SPLIT_ORDER.get(kv[0], 3), kv[0])))
        for family, series in sorted(families.items())
    }


def plot_history(rows: Sequence[Mapping[str, float | int | None]], out_dir: Path) -> list[Path]:
    """Draw one PNG per metric family into ``out_dir/plots/``, epoch on the x axis.

    Args:
        rows: History rows as :class:`MetricsHistory` writes them (``epoch``, ``step``, metrics).
        out_dir: The directory that gets the ``plots`` folder.

    Returns:
        The PNGs written, in family order; empty when there is nothing to plot.
    """
    names = {k for row in rows for k in row if k not in ("epoch", "step")}
    plots_dir = Path(out_dir) / PLOTS_DIR
    written: list[Path] = []
    used: set[str] = set()
    for family, series in metric_families(names).items():
        stem = _NOT_IN_FILENAME.sub("_", family).strip("_") or "metric"
        while stem in used:  # "a/b" and "a_b" would share a file
            stem += "_"
        used.add(stem)
        plots_dir.mkdir(parents=True, exist_ok=True)
        path = plots_dir / f"{stem}.png"
        atomic_write_bytes(path, _render(family, series, rows))
        written.append(path)
    return written


def _render(
    family: str, series: Mapping[str, str], rows: Sequence[Mapping[str, float | int | None]]
) -> bytes:
    # fixed margins that fit the title, the x label and tick labels of up to ~10 characters
    # (the family is the title: no y label); a constrained layout measures every text
    # first, a third of a plot's time in a job
    figure = Figure(figsize=(6.4, 4.0))
    figure.subplots_adjust(left=0.12, right=0.97, bottom=0.12, top=0.92)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for label, name in series.items():
        xs: list[float] = []
        ys: list[float] = []
        for row in rows:
            x, y = row.get("epoch"), row.get(name)
            if x is not None and y is not None:
                xs.append(x)
                ys.append(y)
        axes.plot(xs, ys, marker="o", markersize=3, label=label)
    axes.set_title(family)
    axes.set_xlabel("epoch")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.grid(alpha=0.3)
    axes.legend()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()
