"""run_data.csv (one row per job) and run_data.json (one job), written whole or not at all;
a sweep's rows kept on disk until run_data.csv is written."""

from __future__ import annotations

import csv
import gc
import json
import weakref
from dataclasses import replace
from pathlib import Path
from typing import Any

from furcate_hydra.store.run_data import (
    JobRow,
    write_ordered_run_data_csv,
    write_run_data_csv,
    write_run_data_json,
)
from furcate_hydra.store.sweep_rows import SweepRows


def row(job_num: int, **changes: Any) -> JobRow:
    base = JobRow(
        job_num=job_num,
        overrides=[f"+lr=0.{job_num}", "+bs=32"],
        status="FINISHED",
        skipped=False,
        run_id=f"run-{job_num}",
        fingerprint=f"fp-{job_num}",
        output_dir=f"/sweep/{job_num}",
    )
    return replace(base, **changes)


def test_csv_rows_by_job_number_with_the_union_of_metrics(tmp_path: Path) -> None:
    path = tmp_path / "run_data.csv"
    rows = [
        row(2, metrics={"val_loss": 0.2, "acc": 0.9}, return_value=0.2, start=10.0, end=12.5),
        row(0, metrics={"val_loss": 0.4}, return_value={"best": [1, 2]}),
        row(
            1,
            status="FAILED",
            error="Traceback (most recent call last):\n  File x\nValueError: bad",
            resumed=True,
        ),
        row(3, skipped=True, run_id=None, return_value=(1, 2)),
    ]
    write_run_data_csv(path, rows)
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        assert reader.fieldnames == [
            "job_num",
            "overrides",
            "status",
            "skipped",
            "resumed",
            "return_value",
            "acc",
            "val_loss",
            "start",
            "end",
            "duration_s",
            "rss_peak_mb",
            "gpu_mem_peak_mb",
            "run_id",
            "fingerprint",
            "output_dir",
            "error",
        ]
        table = list(reader)
    assert [r["job_num"] for r in table] == ["0", "1", "2", "3"]
    first, failed, timed, skipped = table
    assert first["overrides"] == "+lr=0.0 +bs=32"
    assert json.loads(first["return_value"]) == {"best": [1, 2]}
    assert (first["val_loss"], first["acc"]) == ("0.4", "")
    assert (timed["val_loss"], timed["acc"]) == ("0.2", "0.9")
    assert (timed["start"], timed["end"], timed["duration_s"]) == ("10.0", "12.5", "2.5")
    assert first["duration_s"] == "" and first["error"] == ""
    assert failed["error"] == "Traceback (most recent call last):"
    assert (failed["status"], failed["resumed"], failed["return_value"]) == (
        "FAILED",
        "True",
        "null",
    )
    assert (skipped["skipped"], skipped["run_id"], skipped["return_value"]) == (
        "True",
        "",
        "[1, 2]",
    )


def test_csv_without_metrics_or_rows(tmp_path: Path) -> None:
    path = tmp_path / "run_data.csv"
    write_run_data_csv(path, [])
    assert path.read_text().splitlines() == [
        "job_num,overrides,status,skipped,resumed,return_value,start,end,duration_s,"
        "rss_peak_mb,gpu_mem_peak_mb,run_id,fingerprint,output_dir,error"
    ]


def test_csv_replaces_the_old_file_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    path = sweep / "run_data.csv"
    path.write_text("stale\n")
    write_run_data_csv(path, [row(0)])
    write_run_data_csv(path, [row(0), row(1)])
    assert [p.name for p in sweep.iterdir()] == ["run_data.csv"]
    assert len(path.read_text().splitlines()) == 3


def test_json_holds_the_config_timings_and_details(tmp_path: Path) -> None:
    job_dir = tmp_path / "4"
    job_dir.mkdir()
    path = job_dir / "run_data.json"
    config = {"lr": 0.1, "model": {"layers": [64, 32]}, "name": None}
    job = row(4, return_value={"loss": 0.25}, start=100.0, end=101.25, metrics={"acc": 1.0})
    write_run_data_json(path, job, config, {"slot": {"index": 1, "gpus": []}})
    data = json.loads(path.read_text())
    assert data["config"] == config
    assert data["return_value"] == {"loss": 0.25}
    assert (data["job_num"], data["run_id"], data["overrides"]) == (4, "run-4", job.overrides)
    assert (data["duration_s"], data["metrics"]) == (1.25, {"acc": 1.0})
    assert data["slot"] == {"index": 1, "gpus": []}
    assert [p.name for p in job_dir.iterdir()] == ["run_data.json"]


class Result:
    """A task's return value that JSON cannot hold."""

    def __init__(self, loss: float) -> None:
        self.loss = loss

    def __repr__(self) -> str:
        return f"Result(loss={self.loss})"


def test_json_keeps_a_value_json_cannot_hold_as_its_repr(tmp_path: Path) -> None:
    path = tmp_path / "run_data.json"
    write_run_data_json(path, row(0, return_value=Result(0.5)), {"lr": 0.1}, {})
    assert json.loads(path.read_text())["return_value"] == "Result(loss=0.5)"
    write_run_data_json(path, row(0, return_value={1, 2}), {"lr": 0.1}, {})
    assert json.loads(path.read_text())["return_value"] == "{1, 2}"


def test_a_metric_named_like_a_column_does_not_overwrite_it(tmp_path: Path) -> None:
    path = tmp_path / "run_data.csv"
    write_run_data_csv(path, [row(0, metrics={"status": 0.5, "val_acc": 0.9})])
    (line,) = list(csv.DictReader(path.open()))
    assert line["status"] == "FINISHED"
    assert line["metric:status"] == "0.5" and line["val_acc"] == "0.9"


def test_sweep_rows_write_the_same_csv_as_rows_held_in_memory(tmp_path: Path) -> None:
    rows = [
        row(2, return_value=Result(0.2), start=10.0, end=12.5),
        row(0, return_value={"best": [1, 2]}),
        row(1, status="FAILED", error="ValueError: bad"),
        row(3, skipped=True, run_id="run-0", return_value=(1, 2)),
    ]
    table = SweepRows()
    for job in rows:
        table.add(str(job.job_num), job, metrics_pending=job.run_id is not None)
    assert len(table) == 4 and not table.all_finished()
    # run-0 backs two rows (job 3 was skipped: it is job 0's run); run-2 has no metrics
    pending = table.pending_runs(limit=10)
    assert sorted(pending) == ["run-0", "run-1", "run-2"]
    updated = table.set_metrics(["run-0", "run-2"], {"run-0": {"acc": 0.9, "status": 1.0}})
    assert sorted(r.job_num for r in updated) == [0, 3]
    assert table.pending_runs(limit=10) == ["run-1"]
    table.set_metrics(["run-1"], {})
    assert table.pending_runs(limit=10) == []
    metrics = {"acc": 0.9, "status": 1.0}
    expected = [replace(r, metrics=metrics) if r.run_id == "run-0" else r for r in rows]
    write_run_data_csv(tmp_path / "held.csv", expected)
    write_ordered_run_data_csv(tmp_path / "table.csv", table.in_job_order(), table.metric_names)
    assert (tmp_path / "table.csv").read_text() == (tmp_path / "held.csv").read_text()
    assert table.get("1") == rows[2] and table.get("9") is None


def test_sweep_rows_hold_no_row_in_memory() -> None:
    table = SweepRows()
    job = row(0, metrics={"acc": 1.0})
    held = weakref.ref(job)
    table.add("0", job)
    del job
    gc.collect()
    assert held() is None
    assert table.get("0") == row(0, metrics={"acc": 1.0}) and table.all_finished()


def test_run_data_csv_is_rewritten_less_often_as_its_rewrite_grows() -> None:
    """While jobs stream in, run_data.csv is rewritten every 10 s, but never so often that
    rewriting it (which reads every row) takes more than 2 % of the launcher's time: at a
    fixed interval a sweep's cost per job grew with its length."""
    from furcate_hydra.records.after_run import csv_due

    assert not csv_due(now=109.9, written_at=100.0, cost_s=0.05)
    assert csv_due(now=110.0, written_at=100.0, cost_s=0.05)  # a small sweep: every 10 s
    assert not csv_due(now=159.0, written_at=100.0, cost_s=1.2)  # 100,000 rows: 60 s apart
    assert csv_due(now=160.0, written_at=100.0, cost_s=1.2)
    assert csv_due(now=1e9, written_at=0.0, cost_s=0.0)  # the first one: never written
