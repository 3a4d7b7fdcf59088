"""The report as one self-contained HTML page: styles inline, figures as data URIs.

The page opens from a file, a mail attachment or a paper's supplementary material without
the sweep dir beside it. Its one script marks on ``<body>`` how many of its figures the
browser decoded (``data-images-loaded="4/4"``), so a headless browser can check the page.
"""

from __future__ import annotations

import base64
import html
import time
from collections.abc import Iterable, Mapping, Sequence

from furcate_hydra.cli._figures import Figures
from furcate_hydra.cli._values import format_duration, format_time, format_value
from furcate_hydra.store.sweep_snapshot import JobSnapshot, SweepSnapshot

__all__ = ["NO_TRACE", "render_report"]

NO_TRACE = "no trace recorded"

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1240px; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 2em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.FAILED, .INTERRUPTED, .KILLED { color: #b00020; } .RUNNING, .QUEUED { color: #1a5fb4; }
.PRUNED, .SKIPPED { color: #6b6b6b; }
figure { display: inline-block; margin: 0.5em; } figcaption { font-size: 0.85em; color: #555; }
figure img { width: 580px; max-width: 100%; }
dl { display: grid; grid-template-columns: max-content auto; gap: 0.2em 1em; }
dt { font-weight: 600; } dd { margin: 0; }
"""
_SCRIPT = """
window.addEventListener("load", function () {
  var images = Array.prototype.slice.call(document.images);
  var loaded = images.filter(function (img) { return img.complete && img.naturalWidth > 0; });
  document.body.setAttribute("data-images-loaded", loaded.length + "/" + images.length);
});
"""


def render_report(
    snapshot: SweepSnapshot,
    returns: Figures,
    curves: Figures,
    peaks: Mapping[int, Mapping[str, float]],
    peak_names: Sequence[str],
) -> str:
    """The page: the sweep, its job table, return values, learning curves, resource peaks."""
    title = f"Sweep {snapshot.sweep_dir.parent.name}/{snapshot.sweep_dir.name}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        _summary(snapshot),
        '<h2 id="jobs">Jobs</h2>',
        _job_table(snapshot.jobs),
        '<h2 id="return-values">Return value against each swept parameter</h2>',
        _figures(returns),
        '<h2 id="learning-curves">Learning curves</h2>',
        _figures(curves),
        '<h2 id="resources">Resource peaks per job</h2>',
        _peaks(snapshot.jobs, peaks, peak_names),
        f"<script>{_SCRIPT}</script>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _summary(snapshot: SweepSnapshot) -> str:
    counts = ", ".join(f"{s.value} {n}" for s, n in snapshot.counts().items() if n)
    state = snapshot.status + (f" ({snapshot.reason})" if snapshot.reason else "")
    items = [
        ("sweep dir", str(snapshot.sweep_dir)),
        ("state", state),
        ("jobs", counts or "none yet"),
        ("started", format_time(snapshot.start)),
        ("ended", format_time(snapshot.end)),
        ("command", snapshot.command),
        ("store", snapshot.tracking_uri or "none (no MLflow runs recorded)"),
        ("experiment", snapshot.experiment or ""),
        ("sweep run", snapshot.sweep_run_id or ""),
        ("report written", format_time(time.time())),
    ]
    rows = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in items if v)
    return f"<dl>{rows}</dl>"


def _job_table(jobs: Sequence[JobSnapshot]) -> str:
    if not jobs:
        return "<p>No jobs yet.</p>"
    metrics = sorted({name for job in jobs for name in job.metrics if not name.startswith("job/")})
    head = ["job", "status", "reason", "overrides", "started", "duration", "return value"]
    rows = []
    for job in jobs:
        cells = [
            _td(str(job.job_num), numeric=True),
            f'<td class="{_e(job.status.value)}">{_e(job.status.value)}</td>',
            _td(job.error or ""),
            _td(" ".join(job.overrides)),
            _td(format_time(job.start)),
            _td(format_duration(job.duration_s), numeric=True),
            _td(format_value(job.return_value, 80), numeric=True),
            *(_td(format_value(job.metrics.get(name)), numeric=True) for name in metrics),
        ]
        rows.append(f'<tr class="job" data-job="{job.job_num}">{"".join(cells)}</tr>')
    return _table([*head, *metrics], rows, "job-table")


def _figures(figures: Figures) -> str:
    parts = [f"<p>{_e(note)}</p>" for note in figures.notes]
    for plot in figures.plots:
        data = base64.b64encode(plot.png).decode("ascii")
        parts.append(
            f'<figure><img src="data:image/png;base64,{data}" alt="{_e(plot.title)}" '
            f'data-file="{_e(plot.stem)}.png"><figcaption>{_e(plot.title)} '
            f"({_e(plot.stem)}.png)</figcaption></figure>"
        )
    return "\n".join(parts)


def _peaks(
    jobs: Sequence[JobSnapshot], peaks: Mapping[int, Mapping[str, float]], names: Sequence[str]
) -> str:
    if not names:
        return f'<p id="no-trace">{NO_TRACE}: no job has resource metrics (job/…).</p>'
    rows = []
    for job in jobs:
        found = peaks.get(job.job_num, {})
        if found:
            cells = [_td(format_value(found.get(name)), numeric=True) for name in names]
        else:
            cells = [f'<td colspan="{len(names)}">{NO_TRACE}</td>']
        rows.append(
            f'<tr class="peak">{_td(str(job.job_num), numeric=True)}'
            f"{_td(' '.join(job.overrides))}{''.join(cells)}</tr>"
        )
    return _table(["job", "overrides", *(f"peak {n}" for n in names)], rows, "peak-table")


def _table(head: Iterable[str], rows: Iterable[str], table_id: str) -> str:
    header = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join(rows)
    return f'<table id="{table_id}"><thead><tr>{header}</tr></thead><tbody>{body}</tbody></table>'


def _td(text: str, numeric: bool = False) -> str:
    return f'<td class="num">{_e(text)}</td>' if numeric else f"<td>{_e(text)}</td>"


def _e(text: str) -> str:
    return html.escape(text, quote=True)
