"""Hydra's own conformance suites, run against ``hydra/launcher=furcate`` and, on it or on
Hydra's basic launcher, ``hydra/sweeper=furcate``.

The suites' tasks do not use torch, so the fork server preloads nothing here; the default
preload is exercised by the reference-app tests. Some suite cases run one config twice and
expect it to run twice, so every job is recorded in MLflow but none is skipped (rerun=all).
"""

from __future__ import annotations

from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
from hydra.test_utils.launcher_common_tests import (
    BatchedSweeperTestSuite,
    IntegrationTestSuite,
    LauncherTestSuite,
)
from pytest import mark

from hydra_plugins.furcate_launcher.furcate_launcher import FurcateLauncher

# the suites launch jobs, which record into the test's own store
pytestmark = mark.usefixtures("mlflow_store")

FAST = ["hydra.launcher.preload=[]", "hydra.launcher.gpus=[0,1]", "hydra.launcher.rerun=all"]


def test_discovery() -> None:
    """`pip install` of the package makes hydra/launcher=furcate discoverable."""
    launchers = Plugins.instance().discover(Launcher)
    assert FurcateLauncher.__name__ in [launcher.__name__ for launcher in launchers]


@mark.parametrize("launcher_name, overrides", [("furcate", FAST)])
class TestFurcateLauncher(LauncherTestSuite):
    pass


@mark.parametrize(
    "task_launcher_cfg, extra_flags",
    [({}, ["-m", "hydra/job_logging=disabled", "hydra/launcher=furcate", *FAST])],
)
class TestFurcateLauncherIntegration(IntegrationTestSuite):
    pass


SWEEPER = ["hydra/sweeper=furcate"]
# Hydra's default subdir, typed on the command line: a job field the launcher's process must
# pass on unresolved (the suites' own cases set it in the integration suite).
JOB_NUM_SUBDIR = "hydra.sweep.subdir=${hydra.job.num}"


@mark.parametrize("launcher_name, overrides", [("furcate", [*FAST, *SWEEPER, JOB_NUM_SUBDIR])])
class TestFurcateSweeperStreaming(LauncherTestSuite):
    """The launcher suite again, with the grid sweeper streaming jobs onto the slots."""


@mark.parametrize(
    "task_launcher_cfg, extra_flags",
    [({}, ["-m", "hydra/job_logging=disabled", "hydra/launcher=furcate", *SWEEPER, *FAST])],
)
class TestFurcateSweeperIntegration(IntegrationTestSuite):
    """The integration suite with the grid sweeper, watching the app's config file (its
    default): several cases set ``hydra.sweep.subdir=cli_dir_${hydra.job.num}`` on the command
    line, which only a job can resolve, and the sweeper reads the command line to reload edits."""


@mark.parametrize(
    "launcher_name, overrides",
    [
        ("furcate", [*FAST, *SWEEPER, "hydra.sweeper.max_batch_size=2"]),
        ("basic", [*SWEEPER, "hydra.sweeper.max_batch_size=2"]),
    ],
    ids=["furcate-launcher-streaming", "basic-launcher-batches"],
)
class TestFurcateSweeperBatched(BatchedSweeperTestSuite):
    """Returns come grouped in max_batch_size batches, whether streamed or launched in batches."""
