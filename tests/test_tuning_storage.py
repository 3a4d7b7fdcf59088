"""The Optuna storage several processes open at once: schema creation never races."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import optuna

OPEN_AT = """
import sys, time
from furcate_hydra.tuning.storage import rdb_storage
start = float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))  # all processes open the fresh file together
storage = rdb_storage(sys.argv[1])
print(len(storage.get_all_studies()))
"""


def test_processes_opening_a_fresh_sqlite_study_file_at_once_all_succeed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    start = time.time() + 4.0  # after every interpreter has imported optuna
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN_AT, url, str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [process.communicate(timeout=120) for process in processes]
    for process, (stdout, stderr) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, stderr
        assert stdout.strip() == "0"
    # and the file is one healthy study store
    optuna.create_study(study_name="s", storage=url).optimize(lambda t: 1.0, n_trials=1)
    assert len(optuna.load_study(study_name="s", storage=url).trials) == 1
