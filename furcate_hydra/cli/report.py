"""``furcate report [SWEEP_DIR]``: the sweep as a page to open in a browser or attach to a draft.

SweepReader ──► snapshot (the job table) + every job run's metric histories (one query)
            ──► return value against each swept parameter      ┐ PNGs in <sweep>/report/,
            ──► learning curves, one plot per metric, all jobs ┘ embedded in report.html
            ──► peaks of the resource trace (job/… metrics), or "no trace recorded"
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from furcate_hydra.atomic import atomic_write_bytes
from furcate_hydra.cli._figures import curve_plots, return_value_plots
from furcate_hydra.cli._html import render_report
from furcate_hydra.layout import SweepPaths
from furcate_hydra.store.metric_history import MetricPoint, metric_histories
from furcate_hydra.store.sweep_reader import SweepReader
from furcate_hydra.store.sweep_snapshot import JobSnapshot

__all__ = ["RESOURCE_METRICS", "resource_peaks", "write_report"]

# the launcher's resource trace, sampled per job; shown in this order, other job/… after them
RESOURCE_METRICS = ("job/rss_mb", "job/cpu_percent", "job/gpu_mem_mb", "job/gpu_util_percent")
RESOURCE_PREFIX = "job/"


def write_report(reader: SweepReader, out_dir: Path | None = None) -> Path:
    """Write ``report.html`` and its PNGs into ``out_dir`` (default ``<sweep dir>/report``);
    returns the page's path."""
    snapshot = reader.snapshot()
    out = out_dir or reader.paths.report_dir
    histories: dict[str, dict[str, list[MetricPoint]]] = {}
    if reader.client is not None:
        wanted = {job.run_id: list(job.metrics) for job in snapshot.jobs if job.run_id}
        histories = metric_histories(reader.client, wanted)
    returns = return_value_plots(snapshot.jobs)
    curves = curve_plots(snapshot.jobs, histories)
    peaks = resource_peaks(snapshot.jobs, histories)
    names = _peak_names(peaks)
    out.mkdir(parents=True, exist_ok=True)
    written = set()
    for plot in [*returns.plots, *curves.plots]:
        atomic_write_bytes(out / f"{plot.stem}.png", plot.png, durable=False)
        written.add(f"{plot.stem}.png")
    for old in out.glob("*.png"):  # figures of an earlier report that this one has not
        if old.name not in written:
            old.unlink(missing_ok=True)
    page = render_report(snapshot, returns, curves, peaks, names)
    path = out / SweepPaths.REPORT_HTML
    atomic_write_bytes(path, page.encode("utf-8"), durable=False)
    return path


def resource_peaks(
    jobs: Sequence[JobSnapshot], histories: Mapping[str, Mapping[str, Sequence[MetricPoint]]]
) -> dict[int, dict[str, float]]:
    """Per job with a resource trace, the highest value of each of its ``job/…`` metrics."""
    peaks: dict[int, dict[str, float]] = {}
    for job in jobs:
        history = histories.get(job.run_id or "", {})
        found = {}
        for name, points in history.items():
            values = [p.value for p in points if not math.isnan(p.value)]
            if name.startswith(RESOURCE_PREFIX) and values:
                found[name] = max(values)
        for name, value in job.metrics.items():  # no history read (a store without one)
            if name.startswith(RESOURCE_PREFIX) and name not in found and not math.isnan(value):
                found[name] = value
        if found:
            peaks[job.job_num] = found
    return peaks


def _peak_names(peaks: Mapping[int, Mapping[str, float]]) -> list[str]:
    names = {name for found in peaks.values() for name in found}
    known = [name for name in RESOURCE_METRICS if name in names]
    return known + sorted(names - set(known))
