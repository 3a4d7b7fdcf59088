"""``furcate status`` and ``furcate ls`` on real sweeps: finished, running, and killed ones.

The sweeps are real (the launcher, its fork server, job processes, a sqlite store); the
command runs in this process (``main``), and once as its own interpreter from elsewhere.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from furcate_hydra.cli.main import USAGE_ERROR, main
from furcate_hydra.layout import SweepPaths
from tests.conftest import REPO, LaunchJobs
from tests.process_helpers import killed_if_left, start_probe_sweep

CRASHES = ["ok", "raise", "exit", "os_exit", "sigkill", "segfault"]
REASONS = {
    "ok": None,
    "raise": "ValueError: the task raised on purpose",
    "exit": "sys.exit(3)",
    "os_exit": "os._exit(4)",
    "sigkill": "killed by SIGKILL",
    "segfault": "segfault (SIGSEGV)",
}


def status(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["status", *args, "--json"]) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def nonzero(counts: dict[str, int]) -> dict[str, int]:
    return {state: n for state, n in counts.items() if n}


def test_a_finished_sweep_gives_each_failure_its_one_line_reason(
    launch_jobs: LaunchJobs, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = launch_jobs.sweep_dir
    launch_jobs([[f"mode={mode}"] for mode in CRASHES], ["hydra.launcher.gpus=[0,1]"])
    launch_jobs.last.close()

    data = status(capsys, str(sweep))
    assert set(data) == {"sweep", "counts", "jobs"}
    assert nonzero(data["counts"]) == {"FINISHED": 1, "FAILED": 5}
    assert set(data["counts"]) >= {"FINISHED", "FAILED", "KILLED", "RUNNING", "SKIPPED", "PRUNED"}
    jobs = data["jobs"]
    assert [job["overrides"] for job in jobs] == [[f"mode={m}"] for m in CRASHES]
    assert {job["overrides"][0][5:]: job["error"] for job in jobs} == REASONS
    ok = jobs[0]
    assert ok["status"] == "FINISHED" and ok["return_value"]["num"] == 0
    for job in jobs:
        assert job["job_num"] == jobs.index(job) and job["start"] and job["duration_s"] >= 0
    assert data["sweep"]["status"] == "FAILED" and data["sweep"]["dir"] == str(sweep)

    # the same sweep dir, run again: the finished config is skipped, the others run again
    launch_jobs([[f"mode={mode}"] for mode in CRASHES], ["hydra.launcher.gpus=[0,1]"])
    launch_jobs.last.close()
    again = status(capsys, str(sweep))
    assert nonzero(again["counts"]) == {"SKIPPED": 1, "FAILED": 5}
    skipped = again["jobs"][0]
    assert skipped["status"] == "SKIPPED" and skipped["run_id"] == ok["run_id"]
    assert skipped["return_value"]["num"] == 0
    assert again["sweep"]["run_id"] != data["sweep"]["run_id"]

    # for people: the counts, then a line per job with its reason
    assert main(["status", str(sweep)]) == 0
    text = capsys.readouterr().out
    assert "SKIPPED 1  FAILED 5" in text
    assert "mode=segfault  ← segfault (SIGSEGV)" in text


def test_a_sweep_without_a_store_is_read_from_its_job_dirs(
    launch_jobs: LaunchJobs, capsys: pytest.CaptureFixture[str]
) -> None:
    launch_jobs([["mode=ok"], ["mode=exit"]], ["hydra.launcher.mlflow.enabled=false"])
    launch_jobs.last.close()
    data = status(capsys, str(launch_jobs.sweep_dir))
    assert data["sweep"]["status"] == "NOT RECORDED" and data["sweep"]["tracking_uri"] is None
    assert [(j["status"], j["error"]) for j in data["jobs"]] == [
        ("FINISHED", None),
        ("FAILED", "sys.exit(3)"),
    ]
    assert data["jobs"][0]["return_value"]["num"] == 0 and data["jobs"][0]["run_id"] is None


def wait_for(
    check: Any, capsys: pytest.CaptureFixture[str], sweep: Path, timeout: float = 90
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not SweepPaths.of(sweep).sweep_record.exists():  # Hydra and the launcher start
        assert time.monotonic() < deadline, "the sweep never started"
        time.sleep(0.3)
    while True:
        data = status(capsys, str(sweep))
        if check(data) or time.monotonic() > deadline:
            return data
        time.sleep(0.3)


def test_a_running_sweep_then_its_killed_launcher(
    tmp_path: Path, mlflow_store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    elsewhere = tmp_path / "elsewhere"  # where the command runs later, with no SWEEP_DIR
    sweep = elsewhere / "multirun" / "2026-01-01" / "12-00-00"
    process = start_probe_sweep(
        tmp_path, f"hydra.sweep.dir={sweep}", "sleep=60", "+i=0,1,2", "hydra.launcher.gpus=[0,1]"
    )
    with killed_if_left(process):
        # two slots: two jobs run, the third waits for a slot with its run already open
        running = wait_for(lambda d: d["counts"]["RUNNING"] == 2, capsys, sweep)
        assert nonzero(running["counts"]) == {"RUNNING": 2, "QUEUED": 1}, running
        assert running["sweep"]["status"] == "RUNNING"
        busy, waiting = running["jobs"][:2], running["jobs"][2]
        assert all(job["start"] and job["duration_s"] >= 0 for job in busy)
        assert waiting["status"] == "QUEUED" and waiting["start"] is None and waiting["run_id"]

        os.kill(process.pid, signal.SIGKILL)  # the launcher only: nothing records the end
        process.communicate(timeout=30)

    data = status(capsys, str(sweep))
    assert nonzero(data["counts"]) == {"INTERRUPTED": 3}
    gone = f"its launcher (pid {process.pid} on this machine) has exited"
    assert data["sweep"]["status"] == "INTERRUPTED" and data["sweep"]["reason"] == gone
    assert {job["error"] for job in data["jobs"]} == {f"interrupted: {gone}"}

    # the command itself, in another directory than the sweep's, defaulting to the newest
    # sweep under multirun/ there
    (elsewhere / "multirun" / "2025-12-31" / "23-59-59").mkdir(parents=True)  # no sweep
    done = subprocess.run(
        [sys.executable, "-c", CLI_IMPORTS, "status", "--json"],
        cwd=elsewhere,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ["PYTHONPATH"]])},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    output, loaded = done.stdout.rsplit("\n", 2)[:2]
    assert json.loads(output)["counts"] == data["counts"]
    assert loaded == "[]", "furcate status imported Hydra, torch or Optuna"

    capsys.readouterr()
    assert main(["ls", "--tracking-uri", mlflow_store, "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)["sweeps"]
    assert listed["sweep_dir"] == str(sweep) and listed["status"] == "INTERRUPTED"
    assert listed["counts"] == {"INTERRUPTED": 3}
    assert main(["ls", "--tracking-uri", mlflow_store]) == 0
    text = capsys.readouterr().out
    assert f"probe_app  INTERRUPTED ({gone})\n    {sweep}\n    jobs: INTERRUPTED 3" in text


# ``python -c`` this with the command's arguments: runs furcate, then prints which of the
# libraries it must not load it loaded
CLI_IMPORTS = (
    "import sys\n"
    "from furcate_hydra.cli.main import main\n"
    "code = main(sys.argv[1:])\n"
    "banned = ('hydra', 'omegaconf', 'torch', 'pytorch_lightning', 'optuna')\n"
    "print(sorted(m for m in banned if m in sys.modules))\n"
    "sys.exit(code)\n"
)


# -- bad input ----------------------------------------------------------------------------


def error_of(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    capsys.readouterr()
    assert main(list(args)) == USAGE_ERROR
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err


def test_a_dir_that_is_no_sweep_is_named_with_the_fix(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    unrequested_store: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    missing = error_of(capsys, "status", "nowhere")
    assert "Invalid SWEEP_DIR='nowhere': no such directory. Fix: give the sweep dir" in missing
    (tmp_path / "empty").mkdir()
    empty = error_of(capsys, "status", "empty")
    assert "Invalid SWEEP_DIR='empty': no furcate sweep recorded there" in empty
    assert "Fix: give the sweep dir of a sweep run with hydra/launcher=furcate" in empty
    none = error_of(capsys, "report")
    assert (
        f"no SWEEP_DIR given, no sweep dir under {tmp_path / 'multirun'}, and no sweep in "
        f"{unrequested_store} (MLFLOW_TRACKING_URI: no such file)"
    ) in none
    assert "Fix: give the sweep dir" in none


def test_a_broken_record_or_a_missing_store_is_named_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    record = SweepPaths.of(sweep).sweep_record
    record.write_text("{not json")
    broken = error_of(capsys, "status", str(sweep))
    assert f"its {record.name} cannot be read" in broken and "Fix: delete it and pass" in broken
    record.unlink()
    uri = f"sqlite:///{tmp_path / 'gone.db'}"
    store = error_of(capsys, "status", str(sweep), "--tracking-uri", uri)
    assert f"Invalid --tracking-uri='{uri}': no such sqlite file. Fix:" in store
    assert not (tmp_path / "gone.db").exists()  # MLflow would have made an empty store
    limit = error_of(capsys, "ls", "--limit", "0")
    assert "Invalid --limit=0: must be at least 1" in limit


def test_the_console_script_is_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib import import_module

    import tomllib

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, name = scripts["furcate"].partition(":")
    assert getattr(import_module(module), name) is main
    with pytest.raises(SystemExit) as usage:
        main(["--help"])
    assert usage.value.code == 0
    shown = capsys.readouterr().out
    assert all(f"\n    {command} " in shown for command in ("status", "report", "ls"))
