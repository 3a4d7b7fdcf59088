"""What a sweep of a Lightning task shows: on the console, in its jobs' logs and in MLflow.

One real CLI sweep of tests/apps/lightning_app.py (two jobs that train through ``fit``, on the
furcate launcher's fork server, recording into a sqlite store) is read by every test here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from furcate_hydra.store import Tags
from furcate_hydra.store.run_store import EXPERIMENT_KIND, MODEL_TRAINING
from tests.conftest import APPS, run_cli
from tests.console_helpers import noise_lines
from tests.store_helpers import job_runs, sweep_runs

EPOCHS = 3
USER_WARNING = "furcate-test-user-warning"

# One worker runs them all, so the module's sweep runs once, not once per worker.
pytestmark = pytest.mark.xdist_group("job-console")


@dataclass(frozen=True)
class Sweep:
    result: subprocess.CompletedProcess[str]
    store: str
    job_dirs: list[Path]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory, empty_mlflow_db: Path) -> Sweep:
    tmp = tmp_path_factory.mktemp("console")
    shutil.copyfile(empty_mlflow_db, tmp / "mlflow.db")
    store = f"sqlite:///{tmp / 'mlflow.db'}"
    result = run_cli(
        APPS / "lightning_app.py",
        "-m",
        f"hydra.sweep.dir={tmp / 'sweep'}",
        f"epochs={EPOCHS}",
        "lr=0.05,0.1",
        f"+user_warning={USER_WARNING}",
        cwd=tmp,
        env={**os.environ, "MLFLOW_TRACKING_URI": store},
    )
    assert result.returncode == 0, result.stderr
    return Sweep(result, store, [tmp / "sweep" / "0", tmp / "sweep" / "1"])


def test_jobs_print_no_known_noise_but_real_warnings(sweep: Sweep) -> None:
    outputs = {"console": sweep.result.stdout + sweep.result.stderr}
    for job_dir in sweep.job_dirs:
        outputs[str(job_dir)] = (job_dir / "stderr.log").read_text()
        assert not noise_lines((job_dir / "stdout.log").read_text())
    for where, text in outputs.items():
        assert not noise_lines(text), where
        # the task's own warning, warned while training, still shows; so do Lightning's
        # messages that are no start-up banner
        assert f"UserWarning: {USER_WARNING}" in text, (where, text)
        assert f"`Trainer.fit` stopped: `max_epochs={EPOCHS}` reached." in text, (where, text)


def test_the_console_says_what_happens_before_the_first_job(sweep: Sweep) -> None:
    lines = sweep.result.stdout.splitlines()

    def first(pattern: str) -> int:
        found = [i for i, line in enumerate(lines) if re.search(pattern, line)]
        assert found, (pattern, sweep.result.stdout)
        return found[0]

    # the server is a fork of the launcher, made before MLflow opens the store; it imports
    # what the app's preload names and the launcher has not imported (its task imports torch
    # inside the task function), and furcate's Lightning layer, which every job of a
    # Lightning app would import otherwise (hydra.launcher.lightning=auto)
    forking = first(
        r"furcate: starting the fork server \(a fork of this process; importing torch, "
        r"pytorch_lightning, furcate_hydra\.lightning\._own_trainer\) …$"
    )
    opening = first(r"furcate: opening the MLflow store sqlite:///.*mlflow\.db …$")
    recording = first(r"furcate: recording runs in experiment 'lightning_app'; to see them: ")
    job = first(r"#0 : ")
    assert forking < opening < recording < job


def test_the_experiment_opens_on_its_runs(sweep: Sweep) -> None:
    from mlflow.tracking import MlflowClient

    (parent,) = sweep_runs(sweep.store)
    experiment_id = parent.info.experiment_id
    experiment = MlflowClient(sweep.store).get_experiment(experiment_id)
    assert experiment.tags[EXPERIMENT_KIND] == MODEL_TRAINING
    # MLflow 3.17's UI goes by its GenAI / Model training switch: the logged link sets it
    link = f"http://127.0.0.1:5000/#/experiments/{experiment_id}?workflowType=machine_learning"
    assert f"mlflow ui --backend-store-uri {sweep.store}, then {link}" in sweep.result.stdout


def test_the_sweep_run_is_named_by_its_start_and_overrides(sweep: Sweep) -> None:
    (parent,) = sweep_runs(sweep.store)
    name = parent.info.run_name
    assert re.fullmatch(rf"\d\d:\d\d:\d\d epochs={EPOCHS} lr=0.05,0.1 \+user_warning=\S+", name)
    assert parent.data.tags[Tags.SWEEP_DIR] == str(sweep.job_dirs[0].parent)


def test_every_job_logs_its_epoch_at_the_steps_of_its_metrics(sweep: Sweep) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(sweep.store)
    runs: list[Any] = job_runs(sweep.store)
    assert len(runs) == 2
    for run in runs:
        run_id = run.info.run_id
        epochs = client.get_metric_history(run_id, "epoch")
        # one point per epoch: what a chart's x axis can be instead of the global step
        assert [m.value for m in epochs] == list(range(EPOCHS))
        steps = {m.step: m.value for m in epochs}
        assert len(steps) == EPOCHS
        for key in ("val_loss", "train_loss"):
            history = client.get_metric_history(run_id, key)
            assert [steps.get(m.step) for m in history] == list(range(EPOCHS)), key
