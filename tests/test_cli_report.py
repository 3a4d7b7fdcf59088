"""``furcate report`` on real sweeps, and the page opened in headless Chromium."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from furcate_hydra.cli._figures import curve_plots
from furcate_hydra.cli.main import main
from furcate_hydra.layout import SweepPaths
from furcate_hydra.store.metric_history import MetricPoint
from furcate_hydra.store.sweep_snapshot import JobSnapshot, SweepJobStatus
from tests.conftest import APPS, LaunchJobs, run_cli

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
FIGURES = {
    "return_value_vs_lr.png",
    "return_value_vs_batch_size.png",
    "curve_train_loss.png",
    "curve_val_loss.png",
}


@pytest.fixture(scope="module")
def curves_sweep(tmp_path_factory: pytest.TempPathFactory, empty_mlflow_db: Path) -> Path:
    """Six jobs of the curves app: four log learning curves, two (lr=1.0) fail; the even
    ones that ran log a resource trace."""
    where = tmp_path_factory.mktemp("curves")
    store = where / "mlflow.db"
    shutil.copyfile(empty_mlflow_db, store)
    sweep = where / "sweep"
    result = run_cli(
        APPS / "curves_app.py",
        "-m",
        f"hydra.sweep.dir={sweep}",
        "lr=0.1,0.03,1.0",
        "batch_size=32,64",
        "fail_lr=1.0",
        "hydra.launcher.gpus=[0,1]",
        cwd=where,
        env={**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{store}"},
    )
    assert result.returncode == 1, result.stderr  # the lr=1.0 jobs failed, the sweep says so
    assert main(["report", str(sweep)]) == 0
    return sweep


@pytest.mark.xdist_group("cli-report-curves")
def test_the_report_holds_the_table_the_figures_and_the_resource_peaks(
    curves_sweep: Path,
) -> None:
    report = SweepPaths.of(curves_sweep).report_dir
    assert {p.name for p in report.iterdir()} == {"report.html", *FIGURES}
    for name in FIGURES:
        assert (report / name).read_bytes().startswith(b"\x89PNG\r\n\x1a\n"), name
    page = (report / "report.html").read_text()
    assert 'src="data:image/png;base64,' in page and 'src="curve' not in page  # self-contained
    rows = re.findall(r'<tr class="job" data-job="(\d+)">(.*?)</tr>', page)
    assert [num for num, _ in rows] == ["0", "1", "2", "3", "4", "5"]
    assert all("ValueError: lr=1.0 diverged" in cells for num, cells in rows if num in "45")
    peaks = dict(re.findall(r'<tr class="peak"><td class="num">(\d+)</td>(.*?)</tr>', page))
    # jobs 0 and 2 traced (even, and ran): their peaks; the others have none
    assert "peak job/rss_mb" in page and "peak job/cpu_percent" in page
    assert '<td class="num">120</td><td class="num">52</td>' in peaks["0"]
    assert '<td class="num">120</td><td class="num">52</td>' in peaks["2"]
    assert all("no trace recorded" in peaks[num] for num in "1345")


@pytest.mark.slow  # CI runs it; the quick suite leaves it out (starts Chromium)
@pytest.mark.xdist_group("cli-report-curves")
def test_headless_chromium_renders_the_table_and_every_figure(curves_sweep: Path) -> None:
    chromium = next(filter(None, map(shutil.which, CHROMIUM_NAMES)), None)
    if chromium is None:
        pytest.skip(
            "no chromium binary on PATH (looked for chromium, chromium-browser, google-chrome): "
            "install Debian's chromium package to open the report in a headless browser"
        )
    page = SweepPaths.of(curves_sweep).report_html
    done = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            # runs the page's load handler before the DOM is dumped
            "--virtual-time-budget=5000",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    # the page's script counted the figures the browser decoded
    assert f'data-images-loaded="{len(FIGURES)}/{len(FIGURES)}"' in dom, dom[:3000]
    assert len(re.findall(r'<tr class="job" data-job="\d+">', dom)) == 6
    assert dom.count("<figure>") == len(FIGURES)


def test_a_sweep_without_curves_numbers_or_trace_says_so(launch_jobs: LaunchJobs) -> None:
    launch_jobs([["+i=0"], ["+i=1"]], [])  # the probe app returns a dict, logs nothing
    launch_jobs.last.close()
    assert main(["report", str(launch_jobs.sweep_dir)]) == 0
    report = SweepPaths.of(launch_jobs.sweep_dir).report_dir
    assert [p.name for p in report.iterdir()] == ["report.html"]
    page = (report / "report.html").read_text()
    assert "No job returned a number (or a list of numbers) to plot." in page
    assert "No job logged a metric more than once: no learning curves." in page
    assert '<p id="no-trace">no trace recorded' in page
    assert len(re.findall(r'<tr class="job"', page)) == 2


def drawn_curves(
    monkeypatch: pytest.MonkeyPatch, jobs: Sequence[JobSnapshot], histories: dict[str, Any]
) -> dict[str, tuple[str, list[list[float]]]]:
    """The report's curve plots as drawn: per metric, the x axis's label and each line's x
    values, read from each figure as it is saved."""
    from matplotlib.figure import Figure

    saved: list[Any] = []
    savefig = Figure.savefig

    def keep(figure: Any, *args: Any, **kwargs: Any) -> None:
        saved.append(figure)
        savefig(figure, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    plots = curve_plots(jobs, histories).plots
    assert len(saved) == len(plots)
    drawn = {}
    for plot, figure in zip(plots, saved, strict=True):
        (axes,) = figure.axes
        drawn[plot.title] = (
            axes.get_xlabel(),
            [[float(x) for x in line.get_xdata()] for line in axes.lines],
        )
    return drawn


def test_curves_are_drawn_against_epoch_where_each_point_has_its_own_epoch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job = JobSnapshot(0, ("lr=0.1",), SweepJobStatus.FINISHED, run_id="r")
    # as Lightning logs: an epoch metric at every step it logs anything
    epochs = [MetricPoint(step, float(step // 10), 0) for step in (5, 9, 15, 19)]
    per_epoch = [MetricPoint(9, 0.5, 0), MetricPoint(19, 0.4, 0)]
    per_step = [MetricPoint(step, 0.9, 0) for step in (5, 9, 15, 19)]
    histories = {"r": {"epoch": epochs, "val_loss": per_epoch, "train_loss_step": per_step}}
    assert drawn_curves(monkeypatch, [job], histories) == {
        "val_loss": ("epoch", [[0.0, 1.0]]),  # steps 9 and 19: epochs 0 and 1
        "train_loss_step": ("step", [[5.0, 9.0, 15.0, 19.0]]),  # two points per epoch
    }
    no_epoch = {"r": {"val_loss": per_epoch}}
    assert drawn_curves(monkeypatch, [job], no_epoch) == {"val_loss": ("step", [[9.0, 19.0]])}
