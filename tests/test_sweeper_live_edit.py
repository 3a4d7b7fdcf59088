"""Live edits: the primary config file is edited while a real sweep runs in a subprocess."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import APPS
from tests.sweeper_helpers import ran_jobs

# every test here launches jobs, which record into the test's own store
pytestmark = pytest.mark.usefixtures("mlflow_store")

CONFIG = """\
defaults:
  - override hydra/launcher: furcate
  - override hydra/sweeper: furcate
  - _self_

i: 0
mode: ok
sleep: 0.6
hydra:
  sweeper:
    watch_interval_s: 0.1
    params:
      i: {values}
    exclude: {exclude}
"""


def write_config(path: Path, values: str, exclude: str = "[]") -> None:
    # As editors save: a new file renamed over the old one, never a half-written file.
    temporary = path.with_suffix(".tmp")
    temporary.write_text(CONFIG.format(values=values, exclude=exclude))
    temporary.replace(path)


def wait_for(condition: Callable[[], bool], process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"the sweep ended early:\n{process.communicate()}")
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the sweep")
        time.sleep(0.05)


LAUNCHERS = [
    # the furcate launcher: streamed, the file is checked while jobs run; one slot, so jobs
    # run one after the other and the queue is long while the test edits
    ["hydra.launcher.preload=[]", "hydra.launcher.gpus=[0]"],
    # any other launcher: Hydra batches (of one job here), the file checked between them
    ["hydra/launcher=basic", "hydra.sweeper.max_batch_size=1"],
]


def start(app: Path, sweep_dir: Path, launcher: list[str]) -> subprocess.Popen[str]:
    command = [sys.executable, str(app / "probe_app.py"), "-m", f"hydra.sweep.dir={sweep_dir}"]
    return subprocess.Popen(
        [*command, *launcher],
        cwd=sweep_dir.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )


@pytest.mark.parametrize("launcher", LAUNCHERS, ids=["streaming", "batches"])
def test_editing_the_grid_mid_sweep_queues_new_and_drops_removed_configs(
    tmp_path: Path, launcher: list[str]
) -> None:
    app = tmp_path / "app"
    (app / "conf").mkdir(parents=True)
    shutil.copy(APPS / "probe_app.py", app / "probe_app.py")
    config = app / "conf" / "probe.yaml"
    write_config(config, "0,1,2,3,4,5")
    sweep_dir = tmp_path / "sweep"
    process = start(app, sweep_dir, launcher)
    try:
        wait_for(lambda: (sweep_dir / "0").is_dir(), process)  # job 0 started
        # Drop 4 and 5 (still queued), add 10 and 11, and exclude 11; 0 is kept but finished
        # or running, so it must not run again.
        write_config(config, "0,1,2,3,10,11", exclude="[{i: 11}]")
        wait_for(lambda: (sweep_dir / "2").is_dir(), process)
        # A broken edit is reported and ignored; the sweep goes on with the grid it had.
        write_config(config, "0,1,(")
        stdout, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 0, stderr
    jobs = ran_jobs(sweep_dir)
    assert [job.overrides for job in jobs.values()] == [
        ("i=0",),
        ("i=1",),
        ("i=2",),
        ("i=3",),
        ("i=10",),
    ]
    assert list(jobs) == [0, 1, 2, 3, 4]  # job numbers keep increasing, none reused
    assert "5 of 6 configs in the grid, 1 excluded by hydra.sweeper.exclude ({i=11}: 1)" in stdout
    assert "1 new configs queued, 2 queued configs dropped" in stdout
    assert "furcate: ignoring the edit of" in stdout and "the sweep goes on" in stdout


GROUP_CONFIG = """\
defaults:
  - model: small
  - override hydra/launcher: furcate
  - override hydra/sweeper: furcate
  - _self_

mode: ok
sleep: 1.0
hydra:
  sweeper:
    watch_interval_s: 0.1
    params:
      model: small,big
"""


@pytest.mark.parametrize("launcher", LAUNCHERS, ids=["streaming", "batches"])
def test_a_broken_edit_holds_new_jobs_until_the_files_compose_again(
    tmp_path: Path, launcher: list[str]
) -> None:
    app = tmp_path / "app"
    shutil.copytree(APPS / "conf" / "model", app / "conf" / "model")
    shutil.copy(APPS / "probe_app.py", app / "probe_app.py")
    config = app / "conf" / "probe.yaml"
    config.write_text(GROUP_CONFIG)
    sweep_dir = tmp_path / "sweep"
    process = start(app, sweep_dir, launcher)
    try:
        wait_for(lambda: (sweep_dir / "0").is_dir(), process)
        # Job 1 (model=big) is a config shape not composed yet: it needs the files.
        config.write_text(GROUP_CONFIG.replace("defaults:", "defaults: ["))
        time.sleep(2.5)  # job 0 ends after 1 s; job 1 would have started by now
        assert process.poll() is None, process.communicate()  # alive, on hold
        assert not (sweep_dir / "1").exists()
        config.write_text(GROUP_CONFIG)  # fixed
        stdout, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 0, stderr
    jobs = ran_jobs(sweep_dir)
    assert [job.overrides for job in jobs.values()] == [("model=small",), ("model=big",)]
    assert "furcate: ignoring the edit of" in stdout
    assert "job #1 (model=big) does not compose from the config files as they are now" in stdout
    assert "No new job starts until" in stdout
