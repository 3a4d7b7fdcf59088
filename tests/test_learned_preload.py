"""With ``hydra.launcher.preload`` unset, the fork server takes on what an app's jobs import.

The app imports torch and Lightning inside its main function, so the launcher never has them
(``apps/import_inside_app.py``). Its first sweep's first job imports them itself and reports
it; the server imports them while the sweep goes on, and the jobs after start with them. The
experiment remembers them: the next sweep's server has them before its first job.
``preload=[]`` learns nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from furcate_hydra.store.app_imports import PRELOAD_TAG
from tests.conftest import APPS, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("mlflow_store")]

APP = APPS / "import_inside_app.py"
# one slot: each job holds it long enough for the server to import what the first reported
# before the third job's turn (the second was forked ahead, and may have been placed already)
ONE_SLOT = ("hydra/launcher=furcate", "hydra.launcher.max_workers=1", "+hold_s=4")
LEARNED = "the fork server imported"
REMEMBERED = "the fork server preloads"


def _sweep(tmp_path: Path, name: str, grid: str, *extra: str) -> tuple[dict[int, bool], str]:
    """Each job's ``i`` and whether torch was in its process when its task began; the log."""
    sweep = tmp_path / name
    done = run_cli(APP, "-m", grid, *ONE_SLOT, *extra, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    warm = {}
    for job in sweep.glob("*/warm.json"):
        overrides = (job.parent / ".hydra" / "overrides.yaml").read_text()
        i = int(next(o for o in overrides.split() if o.startswith("+i=")).removeprefix("+i="))
        seen = json.loads(job.read_text())
        assert seen["torch"] == seen["lightning"], seen
        warm[i] = seen["torch"]
    return warm, output


def _remembered(uri: str) -> list[str]:
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("import_inside_app")
    assert experiment is not None
    names: list[str] = json.loads(experiment.tags.get(PRELOAD_TAG, "[]"))
    return names


def test_jobs_after_the_first_start_with_what_it_imported_and_so_does_the_next_sweep(
    tmp_path: Path, mlflow_store: str
) -> None:
    warm, output = _sweep(tmp_path, "first", "+i=1,2,3")
    assert warm[1] is False and warm[3] is True, (warm, output[-3000:])
    # said as the server takes them on: torch as soon as the first job has it, then the rest
    learned = " ".join(line for line in output.splitlines() if LEARNED in line)
    assert "torch" in learned and "lightning" in learned, learned
    assert REMEMBERED not in output
    remembered = _remembered(mlflow_store)
    assert {"torch", "lightning"} <= set(remembered), remembered

    warm, output = _sweep(tmp_path, "second", "+i=4,5")
    assert warm == {4: True, 5: True}, output[-3000:]
    line = next(line for line in output.splitlines() if REMEMBERED in line)
    assert "torch" in line and "lightning" in line and "earlier sweeps" in line, line
    assert LEARNED not in output  # nothing more to learn
    assert _remembered(mlflow_store) == remembered


def test_preload_set_to_nothing_learns_nothing(tmp_path: Path, mlflow_store: str) -> None:
    warm, output = _sweep(tmp_path, "off", "+i=1,2,3", "hydra.launcher.preload=[]")
    assert warm == {1: False, 2: False, 3: False}, output[-3000:]
    assert LEARNED not in output and REMEMBERED not in output
    assert _remembered(mlflow_store) == []
