"""The sweep's progress: counted from real events, shown live on a terminal (a real pty), as
plain status lines elsewhere, or not at all."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.execution.executor import EventKind, JobEvent
from furcate_hydra.execution.job import Job, JobState
from furcate_hydra.execution.slots import Slot
from furcate_hydra.layout import JobPaths
from furcate_hydra.monitor.render import duration_text, metrics_text, status_line
from furcate_hydra.monitor.tally import SweepTally
from furcate_hydra.progress import JobProgress
from tests.conftest import APPS, run_optuna_study, run_probe_sweep
from tests.option_helpers import check_launcher_options

ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")  # a control sequence (CSI)


def job(num: int, tmp_path: Path) -> Job:
    record = Job(str(num), num, (f"+lr={num}",), f"+lr={num}", JobPaths.of(tmp_path))
    record.slot = Slot(num % 2, None, None, None)
    return record


def event(kind: EventKind, record: Job, at: float, **fields: object) -> JobEvent:
    return JobEvent(kind, record, at=at, **fields)  # type: ignore[arg-type]


def test_the_tally_counts_each_job_once_and_estimates_what_is_left(tmp_path: Path) -> None:
    tally = SweepTally(slots=2)
    jobs = [job(i, tmp_path) for i in range(4)]
    tally.submitted(4)
    tally.skipped()
    tally.sweeper_status(to_come=3)
    now = time.time()
    for record in jobs[:2]:
        record.attempts = 1
        tally.on_event(event(EventKind.STARTED, record, now - 10))
    progress = JobProgress(epoch=3, step=30, metrics={"val_loss": 0.25, "acc": 0.9})
    tally.on_event(event(EventKind.PROGRESS, jobs[0], now, progress=progress))
    snap = tally.snapshot()
    assert (snap.done, snap.failed, snap.skipped, snap.queued) == (0, 0, 1, 2 + 3)
    assert [j.num for j in snap.running] == [0, 1]
    assert snap.running[0].epoch == 3 and snap.running[0].metrics["val_loss"] == 0.25
    assert snap.running[1].slot == "CPU slot 1"
    assert snap.eta_s is None  # no job ended yet: nothing to estimate from

    jobs[0].state = JobState.COMPLETED
    tally.on_event(event(EventKind.ENDED, jobs[0], now))
    tally.finished(ok=True)
    jobs[1].state = JobState.COMPLETED  # its process ended, but the task raised
    tally.on_event(event(EventKind.ENDED, jobs[1], now))
    tally.finished(ok=False)
    jobs[2].attempts = 1
    tally.on_event(event(EventKind.STARTED, jobs[2], now - 4))
    snap = tally.snapshot()
    assert (snap.done, snap.failed, len(snap.running), snap.queued) == (1, 1, 1, 1 + 3)
    assert snap.mean_job_s == pytest.approx(10, abs=0.5)
    # the running job has about 6 s left, the 4 queued take 10 s each, on 2 slots
    assert snap.eta_s == pytest.approx((6 + 4 * 10) / 2, abs=1)

    # a crashed attempt re-queued: no longer running, queued again, started again
    jobs[2].attempts = 2
    tally.on_event(event(EventKind.RETRYING, jobs[2], now))
    assert tally.snapshot().retrying == 1 and not tally.snapshot().running
    tally.on_event(event(EventKind.STARTED, jobs[2], now))
    assert tally.snapshot().retrying == 0 and len(tally.snapshot().running) == 1


def test_the_status_line_says_counts_times_and_the_best() -> None:
    tally = SweepTally(slots=1)
    tally.submitted(2)
    tally.sweeper_status(best="0.0123 (trial 7)", pruned=1)
    line = status_line(tally.snapshot())
    assert line.startswith("furcate: 0 done, 0 failed, 0 skipped, 0 running, 2 queued")
    assert "(1 of the done pruned)" in line and "best 0.0123 (trial 7)" in line
    assert "ETA ?" in line
    assert [duration_text(s) for s in (5, 65, 3725, None)] == ["5s", "1m05s", "1h02m", "?"]
    assert metrics_text({"val_loss": 0.123456, "acc": 0.5, "zz": 1.0}, 2) == (
        "epoch 2 acc=0.5 val_loss=0.1235"
    )


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("progress", "fancy", "hydra.launcher.progress='fancy'"),
        ("progress_every_s", 0, "hydra.launcher.progress_every_s"),
    ],
)
def test_bad_progress_options_name_the_key_and_the_fix(
    key: str, value: object, expected: str
) -> None:
    with pytest.raises(FurcateConfigError) as caught:
        check_launcher_options({key: value, "mlflow": {"enabled": False}})
    assert expected in str(caught.value) and "Fix:" in str(caught.value)


def test_a_bad_progress_mode_stops_the_cli_before_any_job(tmp_path: Path) -> None:
    result = run_probe_sweep(tmp_path, "+lr=1,2", "hydra.launcher.progress=fancy")
    assert result.returncode != 0
    assert "hydra.launcher.progress='fancy'" in result.stderr
    assert not (tmp_path / "sweep" / "0").exists()


@pytest.mark.usefixtures("mlflow_store")
def test_without_a_terminal_plain_status_lines_and_no_control_codes(tmp_path: Path) -> None:
    result = run_probe_sweep(
        tmp_path, "+lr=1,2,3", "sleep=1.5", "hydra.launcher.progress_every_s=0.5"
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if "furcate: " in line and "| " in line]
    assert any("running" in line and "ETA" in line for line in lines[:-1]), result.stdout
    assert lines[-1].split("furcate: ")[1].startswith("3 done, 0 failed, 0 skipped, 0 running")
    assert not ANSI.search((result.stdout + result.stderr).encode())


@pytest.mark.usefixtures("mlflow_store")
def test_progress_off_prints_no_status(tmp_path: Path) -> None:
    result = run_probe_sweep(
        tmp_path,
        "+lr=1,2",
        "sleep=1",
        "hydra.launcher.progress=off",
        "hydra.launcher.progress_every_s=0.2",
    )
    assert result.returncode == 0, result.stderr
    assert " done, " not in result.stdout


def run_in_a_terminal(tmp_path: Path, *overrides: str) -> tuple[int, bytes]:
    """The probe app's sweep with a pty as its stdout and stderr, as in a terminal."""
    master, slave = pty.openpty()
    app = [sys.executable, str(APPS / "probe_app.py"), "-m"]
    process = subprocess.Popen(
        [*app, f"hydra.sweep.dir={tmp_path}/sweep", *overrides],
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "160", "TERM": "xterm"},
        start_new_session=True,
    )
    os.close(slave)
    output = b""
    try:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer closed its end
                break
            if not chunk:
                break
            output += chunk
        return process.wait(timeout=60), output
    finally:
        os.close(master)
        if process.poll() is None:
            process.kill()


@pytest.mark.usefixtures("mlflow_store")
def test_on_a_terminal_a_live_view_with_job_output_printed_whole_above_it(
    tmp_path: Path,
) -> None:
    code, output = run_in_a_terminal(tmp_path, "+lr=1,2", "mode=raise", "sleep=1.5")
    assert code != 0  # the jobs raised: Hydra's non-zero exit is kept
    assert ANSI.search(output)  # redrawn in place
    text = ANSI.sub(b"", output).decode(errors="replace")
    assert "job" in text and "slot" in text and "overrides" in text  # the table's header
    assert re.search(r"#0\s+CPU slot \d", text) and "+lr=1 mode=raise sleep=1.5" in text
    # each job's echoed output comes through the view, each line whole
    lines = [line.strip() for line in re.split(r"[\r\n]+", text)]
    assert lines.count("about to raise") == 2
    assert lines.count("stderr line before raise") == 2
    final = "furcate: 0 done, 2 failed, 0 skipped, 0 running, 0 queued"
    assert final in text, text[-3000:]


@pytest.mark.usefixtures("mlflow_store")
def test_the_grid_sweeper_counts_the_configs_it_has_not_submitted_as_queued(
    tmp_path: Path,
) -> None:
    result = run_probe_sweep(
        tmp_path,
        "hydra/sweeper=furcate",
        "+lr=1,2,3,4,5",
        "sleep=1.5",
        "hydra.launcher.progress_every_s=0.5",
    )
    assert result.returncode == 0, result.stderr
    # two slots: while the first two run, the other three wait in the sweeper's queue
    assert "0 done, 0 failed, 0 skipped, 2 running, 3 queued" in result.stdout, result.stdout


@pytest.mark.usefixtures("mlflow_store")
def test_the_optuna_sweeper_shows_its_best_trial(tmp_path: Path) -> None:
    result = run_optuna_study(tmp_path, "hydra.sweeper.n_trials=3")
    assert result.returncode == 0, result.stderr
    final = [line for line in result.stdout.splitlines() if " done, " in line][-1]
    assert "3 done, 0 failed" in final and re.search(r"best [-0-9.e]+ \(trial \d\)", final)
