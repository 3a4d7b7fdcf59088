"""The launcher's per-job resource trace, end to end: a job whose worker holds 200 MiB is traced
to at least that, in trace.csv, its MLflow run, its plot, run_data and the summary, also when
it is killed; ``trace_interval_s=0`` traces nothing; a bad interval stops the sweep."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from furcate_hydra.cli.main import main
from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.store import Tags
from furcate_hydra.tracing.samples import read_trace
from tests.conftest import LaunchJobs, run_probe_sweep
from tests.option_helpers import parse_launcher_options
from tests.store_helpers import artifact_names, job_runs

HELD_MB = 200


def test_a_job_holding_memory_is_traced_to_it_and_a_killed_one_up_to_its_death(
    tmp_path: Path, mlflow_store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from mlflow.tracking import MlflowClient

    result = run_probe_sweep(
        tmp_path,
        "mode=hold",
        f"+hold_mb={HELD_MB}",
        "+hold_s=3",
        "+then=ok,sigkill",
        "hydra.launcher.trace_interval_s=0.5",
    )
    assert result.returncode != 0  # job 1 was killed
    sweep = tmp_path / "sweep"
    client = MlflowClient(mlflow_store)
    runs = {int(run.data.tags[Tags.JOB_NUM]): run for run in job_runs(mlflow_store)}
    rows = {int(row["job_num"]): row for row in csv.DictReader((sweep / "run_data.csv").open())}
    peaks: dict[int, float] = {}
    for num, status in ((0, "FINISHED"), (1, "FAILED")):
        job_dir = sweep / str(num)
        samples = read_trace(job_dir / "trace.csv")
        assert len(samples) >= 2, samples  # a killed job keeps its trace up to its death
        peak = max(s.rss_mb for s in samples)
        assert peak >= HELD_MB  # the worker's memory counts: the job's whole process tree
        assert all(s.gpu_mem_mb is None and s.gpu_util_percent is None for s in samples)
        run_data = json.loads((job_dir / "run_data.json").read_text())
        assert run_data["status"] == status
        assert run_data["rss_peak_mb"] == pytest.approx(peak, abs=0.1)
        assert run_data["gpu_mem_peak_mb"] is None  # a CPU slot
        assert float(rows[num]["rss_peak_mb"]) == run_data["rss_peak_mb"]
        peaks[num] = run_data["rss_peak_mb"]
        run_id = runs[num].info.run_id
        history = client.get_metric_history(run_id, "job/rss_mb")
        assert sorted(m.step for m in history) == list(range(1, len(samples) + 1))
        assert max(m.value for m in history) == pytest.approx(peak, abs=0.01)
        assert client.get_metric_history(run_id, "job/cpu_percent")
        assert "job/gpu_mem_mb" not in client.get_run(run_id).data.metrics
        assert (job_dir / "plots" / "resource_trace.png").stat().st_size > 0
        assert "trace.csv" in artifact_names(mlflow_store, run_id)
        assert "plots/resource_trace.png" in artifact_names(mlflow_store, run_id, "plots")
    # the trace's last sample is no final metric: its peak has a column of its own
    assert not any(name.startswith("job/") for name in rows[0])
    # the summary names the highest peak and its job
    said = re.search(r"peak memory of a job: ([\d,]+) MiB resident \(job #(\d)\)", result.stdout)
    assert said is not None and said.group(0) in (sweep / "summary.md").read_text()
    assert abs(int(said.group(1).replace(",", "")) - max(peaks.values())) <= 1  # MiB, rounded
    assert peaks[int(said.group(2))] == pytest.approx(max(peaks.values()), abs=0.1)

    # furcate status shows each job's peaks; furcate report the highest of each metric
    capsys.readouterr()
    assert main(["status", str(sweep), "--json"]) == 0
    jobs = json.loads(capsys.readouterr().out)["jobs"]
    assert [(job["rss_peak_mb"], job["gpu_mem_peak_mb"]) for job in jobs] == [
        (peaks[0], None),
        (peaks[1], None),
    ]
    assert main(["status", str(sweep)]) == 0
    table = capsys.readouterr().out
    assert "peak MiB" in table and re.search(rf" {peaks[0]:,.0f} +mode=hold \+hold_mb", table)
    assert main(["report", str(sweep)]) == 0
    page = (sweep / "report" / "report.html").read_text()
    assert "peak job/rss_mb" in page and "no trace recorded" not in page


def test_an_interval_of_zero_traces_nothing(
    launch_jobs: LaunchJobs, tmp_path: Path, mlflow_store: str
) -> None:
    from mlflow.tracking import MlflowClient

    launch_jobs([["sleep=1.2"]], ["hydra.launcher.trace_interval_s=0"])
    job_dir = tmp_path / "sweep" / "0"
    assert (job_dir / "probe.json").exists() and not (job_dir / "trace.csv").exists()
    assert not (job_dir / "plots").exists()
    run_data: Any = json.loads((job_dir / "run_data.json").read_text())
    assert run_data["rss_peak_mb"] is None and run_data["gpu_mem_peak_mb"] is None
    (run,) = job_runs(mlflow_store)
    assert not MlflowClient(mlflow_store).get_run(run.info.run_id).data.metrics


@pytest.mark.parametrize("value", ["-1", "ten"])
def test_a_bad_interval_stops_the_sweep_before_any_job(tmp_path: Path, value: str) -> None:
    result = run_probe_sweep(tmp_path, "+i=1,2", f"hydra.launcher.trace_interval_s={value}")
    assert result.returncode != 0
    shown = "-1" if value == "-1" else "'ten'"
    assert (
        f"Invalid hydra.launcher.trace_interval_s={shown}: must be 0 (no resource trace) or a "
        "number of seconds of at least 0.1 between samples. Fix: set e.g. "
        "hydra.launcher.trace_interval_s=10, or =0 to trace nothing."
    ) in result.stderr
    assert not (tmp_path / "sweep" / "0").exists()


@pytest.mark.parametrize("value", [-0.5, "ten", True, math.nan, math.inf, 0.05, None])
def test_the_interval_check_names_the_key_the_value_and_the_fix(value: object) -> None:
    with pytest.raises(FurcateConfigError) as raised:
        parse_launcher_options({"trace_interval_s": value, "mlflow": {"enabled": False}})
    assert f"hydra.launcher.trace_interval_s={value!r}" in str(raised.value)
    assert "=0 to trace nothing" in str(raised.value)


def test_the_interval_defaults_to_ten_seconds_and_zero_turns_it_off() -> None:
    assert parse_launcher_options({"mlflow": {"enabled": False}}).trace_interval_s == 10.0
    off = parse_launcher_options({"trace_interval_s": 0, "mlflow": {"enabled": False}})
    assert off.trace_interval_s == 0.0
