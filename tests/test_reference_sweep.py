"""The README's reference sweep, run as a user runs it: `python train.py -m batch_size=32,64`."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tests.conftest import REPO, run_cli


def test_reference_sweep_runs_on_cpu_slots(tmp_path: Path) -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # as on a machine without a GPU
    result = run_cli(REPO / "train.py", "-m", "batch_size=32,64", "epochs=2", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    log = result.stdout + result.stderr
    assert "CPU slots" in log
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
