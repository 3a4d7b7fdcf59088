"""What a rerun leaves on disk: skipped jobs get a job dir, every row and run_data.json its
metrics, and files get the modes the umask gives."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

from omegaconf import OmegaConf

from tests.conftest import run_probe_sweep

LRS = (0.1, 0.2)


def test_a_rerun_gives_skipped_jobs_a_dir_and_every_row_its_metrics(
    tmp_path: Path, mlflow_store: str
) -> None:
    for name in ("first", "second"):
        result = run_probe_sweep(
            tmp_path, f"hydra.sweep.dir={tmp_path / name}", "mode=metric", "+lr=0.1,0.2"
        )
        assert result.returncode == 0, result.stderr
    assert "skipped 2 of 2 configs" in result.stdout + result.stderr

    for num, lr in enumerate(LRS):
        first, second = tmp_path / "first" / str(num), tmp_path / "second" / str(num)
        ran = json.loads((first / "run_data.json").read_text())
        assert ran["skipped"] is False and ran["metrics"] == {"score": lr}
        skipped = json.loads((second / "run_data.json").read_text())
        assert skipped["skipped"] is True and skipped["status"] == "FINISHED"
        assert skipped["run_id"] == ran["run_id"]
        assert skipped["recorded_output_dir"] == str(first)
        assert skipped["metrics"] == {"score": lr}
        assert not (second / "stdout.log").exists()  # nothing ran there
        # Hydra's own files, as run_job writes them, for tools that read each job's dir
        overrides = OmegaConf.load(second / ".hydra" / "overrides.yaml")
        assert overrides == OmegaConf.load(first / ".hydra" / "overrides.yaml")
        assert OmegaConf.load(second / ".hydra" / "config.yaml").lr == lr

    rows = list(csv.DictReader((tmp_path / "second" / "run_data.csv").open()))
    assert [float(row["score"]) for row in rows] == list(LRS)
    assert all(Path(row["output_dir"]).is_dir() for row in rows)

    umask = os.umask(0)
    os.umask(umask)
    for path in (tmp_path / "first" / "0" / "run_data.json", tmp_path / "first" / "run_data.csv"):
        assert path.stat().st_mode & 0o777 == 0o666 & ~umask, path
