"""``furcate status`` and ``furcate report`` given no sweep dir, where ``./multirun`` has none:
the newest sweep the working directory's store records whose dir is still there.

The sweeps are real: the Hydra CLI in a subprocess, with an app that sets ``hydra.sweep.dir``
to ``logs/train/multiruns/${now:...}`` as lightning-hydra-template does, recording into
./mlflow.db; the command runs as its own interpreter in that directory, then in this process.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from furcate_hydra.cli.main import USAGE_ERROR, main
from tests.conftest import REPO, copy_probe_app, sweep_in_own_dirs

# ``python -c`` this with the command's arguments: runs furcate, then says on stdout's last
# line whether it loaded MLflow
FURCATE = (
    "import sys\n"
    "from furcate_hydra.cli.main import main\n"
    "code = main(sys.argv[1:])\n"
    "print('mlflow' in sys.modules)\n"
    "sys.exit(code)\n"
)


def furcate(where: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The command in ``where``, in this process's environment (MLFLOW_TRACKING_URI as set)."""
    return subprocess.run(
        [sys.executable, "-c", FURCATE, *args],
        cwd=where,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ["PYTHONPATH"]])},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def project(tmp_path: Path, empty_mlflow_db: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the probe app whose store is the launcher's default: ./mlflow.db."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    where = tmp_path / "project"
    copy_probe_app(where)
    shutil.copyfile(empty_mlflow_db, where / "mlflow.db")
    return where


@pytest.mark.slow  # two sweeps through the Hydra CLI, the command in a fresh interpreter twice
def test_an_app_with_its_own_sweep_dirs_is_found_through_its_store(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = f"sqlite:///{project / 'mlflow.db'}"
    first, _ = sweep_in_own_dirs(project, "+lr=0.1,0.2")
    assert not (project / "multirun").exists()

    status = furcate(project, "status", "--json")
    assert status.returncode == 0, status.stderr
    assert status.stderr == f"newest sweep in {store}: {first.relative_to(project)}\n"
    shown, loaded = status.stdout.rsplit("\n", 2)[:2]
    data = json.loads(shown)
    assert data["sweep"]["dir"] == str(first) and data["counts"]["FINISHED"] == 2
    assert loaded == "True"  # reading the sweep's runs takes MLflow; choosing it did not

    report = furcate(project, "report")
    assert report.returncode == 0, report.stderr
    assert (first / "report" / "report.html").is_file()
    assert report.stdout.startswith(f"wrote {first / 'report' / 'report.html'}\n")

    def status_here() -> tuple[dict[str, str], str]:
        capsys.readouterr()
        assert main(["status", "--json"]) == 0
        captured = capsys.readouterr()
        return json.loads(captured.out)["sweep"], captured.err

    # two sweeps: the newest; its dir deleted: the one before
    monkeypatch.chdir(project)
    second, _ = sweep_in_own_dirs(project, "+lr=0.3")
    newest, said = status_here()
    assert newest["dir"] == str(second) and newest["command"] == "+lr=0.3"
    assert said == f"newest sweep in {store}: {second.relative_to(project)}\n"
    shutil.rmtree(second)
    older, said = status_here()
    assert older["dir"] == str(first) and said.endswith(f": {first.relative_to(project)}\n")

    # none left: the error names both places looked at, and the fix
    shutil.rmtree(first)
    assert main(["report"]) == USAGE_ERROR
    error = capsys.readouterr().err
    assert (
        f"no SWEEP_DIR given, no sweep dir under {project / 'multirun'}, and no sweep in {store} "
        "(the default store: the dirs of all 2 of its sweeps are gone)"
    ) in error
    assert "Fix: give the sweep dir" in error and "--tracking-uri of the store" in error


def test_with_no_sweep_anywhere_the_error_names_both_places_and_loads_no_mlflow(
    project: Path,
) -> None:
    (project / "mlflow.db").unlink()
    done = furcate(project, "status")
    assert done.returncode == USAGE_ERROR
    assert done.stderr == (
        f"furcate status: no SWEEP_DIR given, no sweep dir under {project / 'multirun'}, and no "
        f"sweep in sqlite:///{project / 'mlflow.db'} (the default store: no such file). Fix: "
        "give the sweep dir (hydra.sweep.dir, e.g. multirun/2026-01-31/12-00-00), run furcate "
        "in the directory the sweep ran in, or give --tracking-uri of the store it recorded "
        "into.\n"
    )
    assert done.stdout == "False\n", "furcate loaded MLflow to find no sweep"
    assert not (project / "mlflow.db").exists()  # looking made no store


def test_a_store_that_records_no_sweep_or_is_no_mlflow_store_says_so(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(project)
    assert main(["status"]) == USAGE_ERROR
    assert "(the default store: it records none)" in capsys.readouterr().err

    other = project / "other.db"
    with sqlite3.connect(other) as connection:
        connection.execute("CREATE TABLE notes (text TEXT)")
    connection.close()
    uri = f"sqlite:///{other}"
    assert main(["status", "--tracking-uri", uri]) == USAGE_ERROR
    error = capsys.readouterr().err
    assert f"Invalid --tracking-uri='{uri}': it cannot be read as an MLflow store" in error
    assert "Fix: give the sweep dir, or --tracking-uri of the store" in error
