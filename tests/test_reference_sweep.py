"""The README's reference sweep, run as a user runs it: `python train.py -m batch_size=32,64`."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from furcate_hydra.store import Tags
from tests.conftest import REPO, run_cli
from tests.console_helpers import noise_lines
from tests.store_helpers import artifact_names, job_runs


@pytest.mark.slow  # train.py's sweep, from a fresh MLflow store
def test_reference_sweep_runs_on_cpu_slots(tmp_path: Path) -> None:
    # As on a machine without a GPU, with MLflow's default store: mlflow.db in the working dir.
    from mlflow.tracking import MlflowClient

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    env.pop("MLFLOW_TRACKING_URI")
    result = run_cli(REPO / "train.py", "-m", "batch_size=32,64", "epochs=2", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    log = result.stdout + result.stderr
    assert "CPU slots" in log
    assert "furcate: 2 of 2 configs in the grid" in log  # conf/config.yaml picks furcate's sweeper
    # what every job printed alike; train.py seeds quietly, its seed is in the config
    noisy = noise_lines(log) + [line for line in log.splitlines() if "Seed set to" in line]
    assert not noisy, noisy
    (sweep,) = (tmp_path / "multirun").glob("*/*")
    accuracies = {}
    for job in ("0", "1"):
        job_log = (sweep / job / "train.log").read_text()
        match = re.search(r"val_acc=([0-9.]+)", job_log)
        assert match, job_log
        accuracies[job] = float(match.group(1))
        assert (sweep / job / "stdout.log").exists()
        assert (sweep / job / ".hydra" / "overrides.yaml").exists()
    # two epochs of an MLP on digits is far above the 10 % of guessing
    assert all(0.5 < acc <= 1.0 for acc in accuracies.values()), accuracies

    # Every job is a run in ./mlflow.db with Lightning's per-epoch metrics and its files.
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    runs = job_runs(uri)
    assert sorted(r.data.params["batch_size"] for r in runs) == ["32", "64"]
    client = MlflowClient(uri)
    for run in runs:
        assert run.info.status == "FINISHED"
        history = client.get_metric_history(run.info.run_id, "val_acc")
        assert len(history) == 2 and history[0].step < history[1].step  # one per epoch
        value = float(run.data.tags[Tags.RETURN_VALUE].removeprefix("json:"))
        assert round(value, 4) == accuracies[run.data.tags[Tags.JOB_NUM]]  # the log rounds
        names = artifact_names(uri, run.info.run_id)
        assert {"history.json", "stdout.log", "stderr.log", "run_data.json"} <= names
        assert "plots/acc.png" in artifact_names(uri, run.info.run_id, "plots")
        assert "checkpoints/final.ckpt" in artifact_names(uri, run.info.run_id, "checkpoints")
        job_dir = Path(run.data.tags[Tags.OUTPUT_DIR])
        plots = {p.name for p in (job_dir / "plots").iterdir()}
        # and the resource trace's, where the job ran long enough for two samples
        assert plots - {"resource_trace.png"} == {"acc.png", "loss.png"}
    rows = (sweep / "run_data.csv").read_text().splitlines()
    assert len(rows) == 3 and "val_acc" in rows[0]
