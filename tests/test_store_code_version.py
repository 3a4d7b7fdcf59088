"""Which code a run ran: recorded with each run, and what a rerun does with a stale record."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from furcate_hydra.hydra_layer.options import OptionError
from furcate_hydra.store import (
    Action,
    CodeChange,
    CodeCheck,
    Rerun,
    RunRecord,
    RunStatus,
    Tags,
    code_version,
    decide,
)
from hydra_plugins.furcate_launcher.furcate_launcher import FurcateLauncher
from tests.conftest import APPS, run_cli
from tests.store_helpers import job_runs
from tests.sweeper_helpers import ran_jobs


def git(repo: Path, *args: str) -> str:
    command = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t", *args]
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip()


def test_a_module_outside_git_is_known_by_its_hash(tmp_path: Path) -> None:
    task = tmp_path / "task.py"
    task.write_text("x = 1\n")
    before = code_version(task)
    assert before is not None and before.key.startswith("module:") and before.git_commit is None
    assert code_version(task) == before
    task.write_text("x = 2\n")
    after = code_version(task)
    assert after is not None and after.key != before.key
    assert code_version(tmp_path / "missing.py") is None


def test_a_module_in_git_is_known_by_its_commit_and_edits_by_their_hash(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    task = tmp_path / "task.py"
    task.write_text("x = 1\n")
    git(tmp_path, "add", "task.py")
    git(tmp_path, "commit", "-q", "-m", "task")
    commit = git(tmp_path, "rev-parse", "HEAD")

    clean = code_version(task)
    assert clean is not None and clean.key == f"git:{commit}" and clean.git_dirty is False
    assert clean.tags() == {Tags.CODE_VERSION: f"git:{commit}", "mlflow.source.git.commit": commit}
    (tmp_path / "outputs.txt").write_text("untracked files are not code changes")
    assert code_version(task) == clean

    task.write_text("x = 2\n")
    edited = code_version(task)
    assert edited is not None and edited.git_dirty is True
    assert edited.key.startswith(f"git:{commit}+dirty:") and edited.key != clean.key
    task.write_text("x = 3\n")
    assert code_version(task) != edited  # another uncommitted edit is other code again


def finished(run_id: str, version: str | None) -> RunRecord:
    tags = {} if version is None else {Tags.CODE_VERSION: version}
    return RunRecord(run_id, "fp", RunStatus.FINISHED, 0, tags)


@pytest.mark.parametrize(
    "change, recorded, action, other_code",
    [
        (CodeChange.WARN, "v1", Action.SKIP, False),
        (CodeChange.WARN, "v0", Action.SKIP, True),
        (CodeChange.WARN, None, Action.SKIP, True),  # recorded before versions were
        (CodeChange.IGNORE, "v0", Action.SKIP, False),
        (CodeChange.RERUN, "v1", Action.SKIP, False),
        (CodeChange.RERUN, "v0", Action.RUN, False),
    ],
)
def test_a_run_finished_by_other_code_counts_as_code_change_says(
    change: CodeChange, recorded: str | None, action: Action, other_code: bool
) -> None:
    decision = decide(
        [finished("r", recorded)], Rerun.FAILED, lambda r: None, CodeCheck("v1", change)
    )
    assert (decision.action, decision.other_code) == (action, other_code)
    assert decision.record is not None and decision.record.run_id == "r"
    if action is Action.RUN:
        assert decision.reason == "finished by other code"


def test_with_rerun_a_finished_run_of_this_code_still_counts_among_stale_ones() -> None:
    runs = [finished("new", "v0"), finished("old", "v1")]
    decision = decide(runs, Rerun.FAILED, lambda r: None, CodeCheck("v1", CodeChange.RERUN))
    assert decision.action is Action.SKIP and decision.record == runs[1]


def test_a_bad_code_change_value_is_named_with_its_fix() -> None:
    with pytest.raises(OptionError) as raised:
        FurcateLauncher.parse_options({"code_change": "sometimes"})
    message = str(raised.value)
    assert "hydra.launcher.code_change='sometimes'" in message
    assert "must be one of rerun, warn, ignore" in message and "Fix: " in message


@pytest.mark.slow  # several CLI sweeps in a row
def test_a_rerun_after_editing_the_task_warns_or_reruns(tmp_path: Path, mlflow_store: str) -> None:
    app = tmp_path / "app"
    shutil.copytree(APPS / "conf", app / "conf")
    shutil.copy(APPS / "probe_app.py", app / "probe_app.py")

    def sweep(name: str, *overrides: str) -> str:
        result = run_cli(
            app / "probe_app.py",
            "-m",
            "+lr=0.1,0.2",
            f"hydra.sweep.dir={tmp_path / name}",
            *overrides,
            cwd=tmp_path,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout + result.stderr

    sweep("first")
    with (app / "probe_app.py").open("a") as task:
        task.write("# an edit: other code\n")
    warned = sweep("warn")
    assert not ran_jobs(tmp_path / "warn")  # warn: still skipped...
    assert "2 of the 2 skipped configs were finished by other code" in warned  # ...and said
    assert "hydra.launcher.code_change=rerun" in warned

    sweep("rerun", "hydra.launcher.code_change=rerun")
    assert sorted(ran_jobs(tmp_path / "rerun")) == [0, 1]
    versions = {r.data.tags[Tags.CODE_VERSION] for r in job_runs(mlflow_store)}
    assert len(versions) == 2 and all(v.startswith("module:") for v in versions)
    assert sorted(r.info.status for r in job_runs(mlflow_store)) == ["FINISHED"] * 4
