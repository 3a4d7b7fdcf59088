"""The launcher's process reads the command line as typed: job fields are the job's to resolve."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra._internal.hydra import Hydra
from hydra._internal.utils import create_config_search_path
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode

from furcate_hydra.hydra_api.command_line import given_overrides
from furcate_hydra.records.run_ledger import RunLedger
from hydra_plugins.furcate_launcher.furcate_launcher import FurcateLauncher
from tests.conftest import APPS

HYDRA = ["hydra.sweep.subdir=job_${hydra.job.num}"]
TASK = ["+tag=run_${hydra.job.num}", "sleep=0,0.1"]


def test_overrides_that_interpolate_job_fields_are_read_unresolved(
    tmp_path: Path, hydra_restore_singletons: Any
) -> None:
    GlobalHydra.instance().clear()
    hydra = Hydra.create_main_hydra2(
        task_name="probe_app", config_search_path=create_config_search_path(str(APPS / "conf"))
    )
    master = hydra.compose_config(
        "probe",
        [f"hydra.sweep.dir={tmp_path}", *HYDRA, *TASK],
        run_mode=RunMode.MULTIRUN,
        with_log_configuration=False,
    )
    assert given_overrides(master, "hydra") == [f"hydra.sweep.dir={tmp_path}", *HYDRA]
    assert given_overrides(master, "task") == TASK
    # The run ledger tags the sweep's run with the command line: it must not resolve it either.
    options = FurcateLauncher.parse_options({"mlflow": {"enabled": False}}).store
    RunLedger(options, master, code=None)
    GlobalHydra.instance().clear()
