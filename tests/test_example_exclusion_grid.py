"""examples/exclusion_grid as its README runs it: furcate's exclude_configs case, 25 of 30."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from furcate_hydra.store import Tags
from tests.conftest import REPO, run_cli
from tests.store_helpers import job_runs

EXAMPLE = REPO / "examples" / "exclusion_grid" / "exclusion_grid.py"

# (optimizer, learning_rate, batch_size), as in the example's hydra.sweeper.params.
Combo = tuple[str, float, int]
GRID: list[Combo] = list(
    itertools.product(
        ["RMSprop", "SGD", "Adam", "NAdam", "Adadelta"], [0.0001, 0.001, 0.00001], [32, 64]
    )
)


def excluded(combo: Combo) -> bool:
    """The example's hydra.sweeper.exclude, written out independently of the sweeper."""
    optimizer, learning_rate, batch_size = combo
    return (optimizer == "Adadelta" and batch_size == 32) or (
        optimizer == "SGD" and learning_rate == 0.001
    )


def parse_overrides(text: str) -> Combo:
    values = dict(item.split("=", 1) for item in text.split())
    return values["optimizer"], float(values["learning_rate"]), int(values["batch_size"])


@pytest.mark.slow  # the example's 25 Lightning jobs
def test_exclusion_grid_runs_the_25_configs_left(tmp_path: Path, mlflow_store: str) -> None:
    # The job processes inherit MLFLOW_TRACKING_URI (the test's own store) from this process.
    result = run_cli(
        EXAMPLE,
        "-m",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "hydra.launcher.gpus=[]",
        "hydra.launcher.max_workers=2",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    log = result.stdout + result.stderr
    assert re.search(
        r"furcate: 25 of 30 configs in the grid, 5 excluded by hydra\.sweeper\.exclude "
        r"\(\{[^}]*Adadelta[^}]*\}: 3, \{[^}]*SGD[^}]*\}: 2\)",
        log,
    ), log[-4000:]

    runs = job_runs(mlflow_store)
    assert len(runs) == 25
    assert {run.info.status for run in runs} == {"FINISHED"}
    combos = []
    for run in runs:
        params = run.data.params
        combo = (params["optimizer"], float(params["learning_rate"]), int(params["batch_size"]))
        # What the job ran (params) is what the sweeper asked for (overrides).
        assert parse_overrides(run.data.tags[Tags.OVERRIDES]) == combo
        assert not excluded(combo), combo
        # fit logged the Lightning metrics into the job's run.
        assert 0.0 <= run.data.metrics["val_acc"] <= 1.0
        combos.append(combo)
    assert len(set(combos)) == 25
    assert set(combos) == {combo for combo in GRID if not excluded(combo)}
    # Excluded configs take no job number; every job ran in the sweep dir asked for.
    assert sorted(int(run.data.tags[Tags.JOB_NUM]) for run in runs) == list(range(25))
    assert {Path(run.data.tags[Tags.OUTPUT_DIR]).parent for run in runs} == {tmp_path / "sweep"}
