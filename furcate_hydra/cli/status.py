"""``furcate status [SWEEP_DIR] [--json]``: each job's state, why the failed ones failed, the
peak memory of those the launcher traced, and, with ``jobs_per_gpu=auto``, what each GPU runs.

sweep dir ──► SweepReader ──► SweepSnapshot ──► a table for people, or one JSON object:
    {"sweep": {...}, "counts": {"FINISHED": 3, ...}, "jobs": [{"job_num": 0, ...}, ...]}
    (with "gpu_packing": ["GPU 0: 5 at a time, ..."] where jobs_per_gpu=auto ran)
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Sequence
from typing import TextIO

from furcate_hydra.cli._values import (
    format_duration,
    format_time,
    format_value,
    snapshot_json,
)
from furcate_hydra.layout import SweepPaths
from furcate_hydra.store.gpu_packing_file import read_packing_lines
from furcate_hydra.store.sweep_snapshot import JobSnapshot, SweepJobStatus, SweepSnapshot

__all__ = ["print_status"]


def print_status(snapshot: SweepSnapshot, out: TextIO, as_json: bool = False) -> None:
    packing = read_packing_lines(SweepPaths.of(snapshot.sweep_dir).gpu_packing)
    if as_json:
        extra = {"gpu_packing": packing} if packing else {}
        json.dump({**snapshot_json(snapshot), **extra}, out, indent=2)
        out.write("\n")
        return
    out.write(_heading(snapshot))
    if packing:
        out.write("".join(f"{line}\n" for line in packing) + "\n")
    counts = [f"{status.value} {n}" for status, n in snapshot.counts().items() if n]
    out.write(("  ".join(counts) or "no jobs yet") + "\n\n")
    if snapshot.jobs:
        # cut to the terminal's width; piped or redirected, every line whole
        width = shutil.get_terminal_size().columns if out.isatty() else sys.maxsize
        out.write(_table(snapshot.jobs, width))


def _heading(snapshot: SweepSnapshot) -> str:
    state = snapshot.status + (f" ({snapshot.reason})" if snapshot.reason else "")
    lines = [f"sweep    {snapshot.sweep_dir}", f"state    {state}"]
    if snapshot.start is not None:
        started = f"started  {format_time(snapshot.start)}"
        if snapshot.end is not None:
            started += f", ran {format_duration(snapshot.end - snapshot.start)}"
        elif snapshot.status == "RUNNING":
            started += f", running for {format_duration(time.time() - snapshot.start)}"
        lines.append(started)
    if snapshot.command:
        lines.append(f"command  {snapshot.command}")
    if snapshot.tracking_uri:
        lines.append(
            f"store    {snapshot.tracking_uri}  experiment {snapshot.experiment!r}  "
            f"sweep run {snapshot.sweep_run_id}"
        )
    else:
        lines.append("store    none: the sweep recorded no MLflow runs; read from its job dirs")
    return "\n".join(lines) + "\n\n"


def _table(jobs: Sequence[JobSnapshot], width: int) -> str:
    header = ("job", "status", "started", "duration", "return", "peak MiB", "overrides / reason")
    rows = [header] + [
        (
            str(job.job_num),
            job.status.value,
            format_time(job.start)[11:] if job.start else "",
            format_duration(job.duration_s),
            format_value(job.return_value, 16),
            _peaks(job),
            _last_column(job),
        )
        for job in jobs
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    lines = []
    for row in rows:
        cells = [
            row[0].rjust(widths[0]),
            *(cell.ljust(w) for cell, w in zip(row[1:-1], widths[1:], strict=True)),
        ]
        line = "  ".join([*cells, row[-1]])
        lines.append(line if len(line) <= width else line[: width - 1] + "…")
    return "\n".join(lines) + "\n"


def _peaks(job: JobSnapshot) -> str:
    """The resource trace's peaks: resident memory, and GPU memory on a GPU slot."""
    if job.rss_peak_mb is None:
        return ""
    text = f"{job.rss_peak_mb:,.0f}"
    if job.gpu_mem_peak_mb is not None:
        text += f" (GPU {job.gpu_mem_peak_mb:,.0f})"
    return text


def _last_column(job: JobSnapshot) -> str:
    text = " ".join(job.overrides) or "(no overrides)"
    if job.ran_in:
        text += f"  [{job.ran_in}]"
    if job.error:
        text += f"  ← {job.error}"
    if job.status is SweepJobStatus.RUNNING and job.progress is not None:
        text += f"  (epoch {job.progress.epoch}, step {job.progress.step})"
    return text
