"""Which code a run ran: recorded with each run, and what a rerun does with a stale record."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from furcate_hydra.hydra_api.options import OptionError
from furcate_hydra.records.task_code import task_code_version
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
from tests.conftest import copy_probe_app, run_cli, sweep_in_own_dirs
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


def key_of(task: Path, *config_dirs: Path) -> str:
    version = code_version(task, config_dirs)
    assert version is not None
    return version.key


def test_in_git_the_code_is_every_tracked_file_as_on_disk_but_the_config_files(
    tmp_path: Path,
) -> None:
    conf = tmp_path / "conf"
    (conf / "model").mkdir(parents=True)
    task, helper = tmp_path / "task.py", tmp_path / "helper.py"
    task.write_text("x = 1\n")
    helper.write_text("y = 1\n")
    (conf / "app.yaml").write_text("lr: 0.1\n")
    (conf / "model" / "small.yml").write_text("width: 8\n")
    (tmp_path / "vocab.yaml").write_text("a: 1\n")  # beside the code: the task may read it
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-q", "-m", "app")
    commit = git(tmp_path, "rev-parse", "HEAD")

    clean = code_version(task, [conf])
    assert clean is not None and clean.key.startswith("git-code:")
    assert (clean.git_commit, clean.git_dirty) == (commit, False)
    assert clean.tags() == {Tags.CODE_VERSION: clean.key, "mlflow.source.git.commit": commit}
    (tmp_path / "outputs.txt").write_text("untracked files are not code changes")
    assert code_version(task, [conf]) == clean

    # config files: edited, added, committed, the code is the same
    (conf / "app.yaml").write_text("lr: 0.1\nbatch_size: 32\n")
    (conf / "model" / "small.yml").write_text("width: 16\n")
    (conf / "model" / "big.yaml").write_text("width: 64\n")
    assert code_version(task, [conf]) == clean  # git_dirty too: no code file differs
    git(tmp_path, "add", "conf")
    git(tmp_path, "commit", "-q", "-m", "configs")
    assert key_of(task, conf) == clean.key
    # the same files outside the app's config dirs are code
    assert key_of(task) != clean.key
    (tmp_path / "vocab.yaml").write_text("a: 2\n")
    assert key_of(task, conf) != clean.key
    git(tmp_path, "checkout", "-q", "vocab.yaml")
    assert key_of(task, conf) == clean.key

    # code files: each edit is other code; committed, the same content is the same code
    helper.write_text("y = 2\n")
    edited = code_version(task, [conf])
    assert edited is not None and edited.key != clean.key and edited.git_dirty is True
    helper.write_text("y = 3\n")
    again = key_of(task, conf)
    assert again not in (clean.key, edited.key)
    git(tmp_path, "commit", "-q", "-am", "helper")
    assert key_of(task, conf) == again
    helper.unlink()
    assert key_of(task, conf) not in (clean.key, edited.key, again)


def test_an_untracked_task_module_in_git_is_code_all_the_same(tmp_path: Path) -> None:
    (tmp_path / "other.py").write_text("z = 1\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "other.py")
    git(tmp_path, "commit", "-q", "-m", "other")
    task = tmp_path / "task.py"
    task.write_text("x = 1\n")
    before = key_of(task)
    assert before.startswith("git-code:")
    task.write_text("x = 2\n")
    assert key_of(task) != before


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
    copy_probe_app(app)

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


@pytest.mark.slow  # four CLI sweeps in a row
def test_in_git_a_config_edit_is_no_code_change_and_a_code_edit_is(
    tmp_path: Path, mlflow_store: str
) -> None:
    app = tmp_path / "app"  # its sweeps write into it, as lightning-hydra-template's do
    copy_probe_app(app)
    git(app, "init", "-q")
    git(app, "add", ".")
    git(app, "commit", "-q", "-m", "app")
    lrs = "+lr=0.1,0.2"

    first, _ = sweep_in_own_dirs(app, lrs)
    assert sorted(ran_jobs(first)) == [0, 1]

    # a config group option the jobs do not use: their configs are the same, so is the code
    (app / "conf" / "model" / "big.yaml").write_text("hidden: 512  # wider\n")
    (app / "conf" / "model" / "huge.yaml").write_text("hidden: 4096\n")
    same, output = sweep_in_own_dirs(app, lrs)
    assert not ran_jobs(same) and "skipped 2 of 2 configs" in output
    assert "other code" not in output

    # an edit that changes the jobs' configs: new configs, which run
    probe = app / "conf" / "probe.yaml"
    probe.write_text(probe.read_text().replace("sleep: 0.0", "sleep: 0.01"))
    changed, output = sweep_in_own_dirs(app, lrs)
    assert sorted(ran_jobs(changed)) == [0, 1] and "other code" not in output

    with (app / "probe_app.py").open("a") as task:
        task.write("# an edit: other code\n")
    stale, output = sweep_in_own_dirs(app, lrs)
    assert not ran_jobs(stale)
    assert "2 of the 2 skipped configs were finished by other code" in output

    runs = job_runs(mlflow_store)
    assert len(runs) == 4 and {r.info.status for r in runs} == {"FINISHED"}
    versions = {r.data.tags[Tags.CODE_VERSION] for r in runs}
    assert len(versions) == 1 and versions.pop().startswith("git-code:")


def test_the_config_dirs_are_those_hydra_composed_from_files_and_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    # a work tree with the task, a config folder, a config package and a config file beside
    # the code (code: the task may read it); the working directory, where a source without
    # files must not count as a folder
    task = tmp_path / "task.py"
    task.write_text("def task(config):\n    return 1\n")
    (tmp_path / "vocab.yaml").write_text("a: 1\n")
    conf, package = tmp_path / "conf", tmp_path / "probe_conf_package"
    conf.mkdir()
    package.mkdir()
    (conf / "app.yaml").write_text("lr: 0.1\n")
    (package / "__init__.py").write_text("")
    (package / "model.yaml").write_text("width: 8\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-q", "-m", "app")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    request.addfinalizer(lambda: sys.modules.pop(package.name, None))  # imported by the check
    spec = importlib.util.spec_from_file_location("task", task)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    sources = [
        {"path": package.name, "schema": "pkg", "provider": "app"},
        {"path": str(conf), "schema": "file", "provider": "main"},
        {"path": "", "schema": "structured", "provider": "schema"},  # no files
        {"path": "no_such_package.conf", "schema": "pkg", "provider": "gone"},
    ]

    def key(*used: dict[str, str]) -> str:
        config = OmegaConf.create({"hydra": {"runtime": {"config_sources": list(used)}}})
        version = task_code_version(module.task, config)
        assert version is not None
        return version.key

    clean = key(*sources)
    (conf / "app.yaml").write_text("lr: 0.2\n")
    (package / "model.yaml").write_text("width: 16\n")
    assert key(*sources) == clean  # the folder's and the package's config files: no code
    assert key(*sources[2:]) != clean  # the same files, no config dirs named: code
    (tmp_path / "vocab.yaml").write_text("a: 2\n")
    assert key(*sources) != clean  # beside the code: code
