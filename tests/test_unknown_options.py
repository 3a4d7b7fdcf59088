"""A key no plugin option has is refused, with the closest option, however it arrives
(Hydra suggests ``+hydra.launcher.<key>=...`` for a key its schema lacks, and takes that)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from furcate_hydra.hydra_api.options import OptionError
from hydra_plugins.furcate_launcher.furcate_launcher import FurcateLauncher
from hydra_plugins.furcate_optuna_sweeper.furcate_optuna_sweeper import FurcateOptunaSweeper
from hydra_plugins.furcate_sweeper.furcate_sweeper import FurcateSweeper
from tests.conftest import run_probe_sweep
from tests.store_helpers import job_runs
from tests.sweeper_helpers import ran_jobs

Parse = Callable[[Mapping[str, Any]], Any]
LAUNCHER: Parse = FurcateLauncher.parse_options
GRID: Parse = FurcateSweeper.parse_options
OPTUNA: Parse = FurcateOptunaSweeper.parse_options


@pytest.mark.parametrize(
    "parse, options, message",
    [
        (
            LAUNCHER,
            {"jobs_per_gpus": 2},
            "Invalid hydra.launcher.jobs_per_gpus=2: not an option of hydra/launcher=furcate. "
            "Fix: did you mean hydra.launcher.jobs_per_gpu? (its options: allow_cpu,",
        ),
        (
            LAUNCHER,
            {"mlflow": {"tracking_url": "http://127.0.0.1:5000"}},
            "Invalid hydra.launcher.mlflow.tracking_url='http://127.0.0.1:5000': not an option "
            "of hydra.launcher.mlflow (hydra/launcher=furcate). "
            "Fix: did you mean hydra.launcher.mlflow.tracking_uri? (its options: enabled,",
        ),
        (
            LAUNCHER,
            {"colour": "blue"},  # nothing close: every option is listed
            "Invalid hydra.launcher.colour='blue': not an option of hydra/launcher=furcate. "
            "Fix: set one of its options instead: allow_cpu, auto_min_gain, backend, "
            "checkpoint_every_n_steps, checkpoint_every_s,",
        ),
        (
            GRID,
            {"watch_interval": 2},
            "Invalid hydra.sweeper.watch_interval=2: not an option of hydra/sweeper=furcate. "
            "Fix: did you mean hydra.sweeper.watch_interval_s? (its options: exclude,",
        ),
        (
            OPTUNA,
            {"n_trial": 50},
            "Invalid hydra.sweeper.n_trial=50: not an option of hydra/sweeper=furcate_optuna. "
            "Fix: did you mean hydra.sweeper.n_trials? (its options: asynchronous,",
        ),
    ],
    ids=["launcher", "launcher-nested", "launcher-no-match", "grid-sweeper", "optuna-sweeper"],
)
def test_an_unknown_key_is_refused_with_the_closest_option(
    parse: Parse, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(OptionError, match="^" + re.escape(message)):
        parse(options)


def test_hydras_own_keys_and_the_optuna_defaults_list_are_no_unknown_keys() -> None:
    assert LAUNCHER({"_target_": "furcate"}).slots.jobs_per_gpu is None
    GRID({"_target_": "furcate"})
    OPTUNA({"defaults": [{"sampler": "tpe"}], "pruner": {"name": "none"}})


def test_a_mistyped_key_added_on_the_command_line_stops_the_sweep(
    tmp_path: Path, mlflow_store: str
) -> None:
    result = run_probe_sweep(tmp_path, "+hydra.launcher.jobs_per_gpus=2", "+i=0,1")
    assert result.returncode != 0
    assert (
        "Invalid hydra.launcher.jobs_per_gpus=2: not an option of hydra/launcher=furcate. "
        "Fix: did you mean hydra.launcher.jobs_per_gpu?"
    ) in result.stderr
    assert "Traceback" not in result.stderr
    assert ran_jobs(tmp_path / "sweep") == {}
    assert job_runs(mlflow_store) == []
