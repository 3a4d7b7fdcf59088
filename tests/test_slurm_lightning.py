"""A furcate job's Trainer on a machine with Slurm: no hint to start it with ``srun``.

Lightning warns in every Trainer that "the `srun` command is available on your system but is
not used" wherever ``srun`` is on PATH and srun did not start the process. A furcate job is
one process on its slot inside the allocation, so the jobs filter that one warning (both
Lightning namespaces); a fake ``srun`` on PATH stands for Slurm's.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from furcate_hydra.known_warnings import ignore_lightning_srun_hint


@pytest.mark.parametrize("namespace", ["pytorch_lightning", "lightning.pytorch"])
def test_a_jobs_trainer_shows_no_srun_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, namespace: str
) -> None:
    import importlib

    srun = tmp_path / "srun"
    srun.write_text("#!/bin/sh\nexit 0\n")
    srun.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_NTASKS", raising=False)
    trainer_class = importlib.import_module(namespace).Trainer

    def srun_hints() -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if hinted:
                ignore_lightning_srun_hint()
            trainer_class(logger=False, enable_checkpointing=False, enable_progress_bar=False)
        return [str(w.message) for w in caught if "`srun` command" in str(w.message)]

    hinted = False
    assert srun_hints(), "Lightning no longer hints at srun: the filter can go"
    hinted = True
    assert srun_hints() == []
