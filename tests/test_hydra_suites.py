"""Hydra's own conformance suites, run against ``hydra/launcher=furcate`` and, on it or on
Hydra's basic launcher, ``hydra/sweeper=furcate``, in three shapes:

- each test with its own MLflow store, every job run (rerun=all: some cases run one config
  twice and look at what the second run wrote);
- the job-num interpolation a user types (``hydra.sweep.subdir=${hydra.job.num}``);
- one store shared by all the tests of a class, as the default store in a working dir is:
  with the default rerun policy a config finished in an earlier test is skipped, and its
  JobReturn must still satisfy the suite (the recorded return value, a working dir with the
  job's log and ``.hydra/`` files). The integration suite's tasks write files as they run,
  which a skipped job cannot: a shared store would have it run every job again, which the
  launcher suite's shared-store shape already covers (other sweeps in the store), so the
  integration suite runs on a store of its own per test.

The suites' tasks do not use torch, so the fork server preloads nothing here; the default
preload is exercised by the reference-app tests.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
from hydra.test_utils.launcher_common_tests import (
    BatchedSweeperTestSuite,
    IntegrationTestSuite,
    LauncherTestSuite,
)
from pytest import mark

from hydra_plugins.furcate_launcher.furcate_launcher import FurcateLauncher
from tests.store_helpers import job_runs

SLOTS = ["hydra.launcher.preload=[]", "hydra.launcher.gpus=[0,1]"]
FAST = [*SLOTS, "hydra.launcher.rerun=all"]


@pytest.fixture(scope="class")
def class_store_path(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    empty_mlflow_db: Path,
) -> Path:
    # One file per class, kept if pytest sets the fixture up again for the same class (when a
    # worker runs other tests between the class's own): the class's checks read every sweep.
    path = tmp_path_factory.getbasetemp() / f"class_store-{request.node.name}" / "mlflow.db"
    if not path.exists():
        path.parent.mkdir(parents=True)
        shutil.copyfile(empty_mlflow_db, path)
    return path


@pytest.fixture
def class_store(
    no_outside_store: None, class_store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> str:
    """One sqlite store for every test of the class (jobs inherit MLFLOW_TRACKING_URI)."""
    uri = f"sqlite:///{class_store_path}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def assert_nothing_ran_twice(uri: str) -> None:
    """The class's tests ran configs more than once; each finished config has one run."""
    fingerprints = [run.data.tags["furcate.fingerprint"] for run in job_runs(uri)]
    assert fingerprints
    assert len(set(fingerprints)) == len(fingerprints)


def test_discovery() -> None:
    """`pip install` of the package makes hydra/launcher=furcate discoverable."""
    launchers = Plugins.instance().discover(Launcher)
    assert FurcateLauncher.__name__ in [launcher.__name__ for launcher in launchers]


@mark.usefixtures("mlflow_store")
@mark.parametrize("launcher_name, overrides", [("furcate", FAST)])
class TestFurcateLauncher(LauncherTestSuite):
    pass


@mark.xdist_group("launcher-shared-store")  # the class's tests share one store: one worker
@mark.usefixtures("class_store")
@mark.parametrize("launcher_name, overrides", [("furcate", SLOTS)])
class TestFurcateLauncherSharedStore(LauncherTestSuite):
    """Configs finished by an earlier test of the class are skipped, not run again."""

    def test_no_config_ran_twice(
        self, class_store: str, launcher_name: str, overrides: list[str]
    ) -> None:  # defined here, it runs after the suite's cases
        assert_nothing_ran_twice(class_store)


@mark.usefixtures("mlflow_store")
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


@mark.usefixtures("mlflow_store")
@mark.parametrize("launcher_name, overrides", [("furcate", [*FAST, *SWEEPER, JOB_NUM_SUBDIR])])
class TestFurcateSweeperStreaming(LauncherTestSuite):
    """The launcher suite again, with the grid sweeper streaming jobs onto the slots."""


@mark.slow  # CI runs it; the quick suite has the launcher integration and sweeper suites
@mark.usefixtures("mlflow_store")
@mark.parametrize(
    "task_launcher_cfg, extra_flags",
    [({}, ["-m", "hydra/job_logging=disabled", "hydra/launcher=furcate", *SWEEPER, *FAST])],
)
class TestFurcateSweeperIntegration(IntegrationTestSuite):
    """The integration suite with the grid sweeper, watching the app's config file (its
    default): several cases set ``hydra.sweep.subdir=cli_dir_${hydra.job.num}`` on the command
    line, which only a job can resolve, and the sweeper reads the command line to reload edits."""


@mark.usefixtures("mlflow_store")
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


BATCHED_SHARED = [*SLOTS, *SWEEPER, JOB_NUM_SUBDIR, "hydra.sweeper.max_batch_size=2"]


@mark.xdist_group("sweeper-shared-store")
@mark.usefixtures("class_store")
@mark.parametrize(
    "launcher_name, overrides",
    # the suite extends the list it is given: one copy each
    [("furcate", list(BATCHED_SHARED)), ("furcate", list(BATCHED_SHARED))],
    ids=["runs", "skips-all"],
)
class TestFurcateSweeperSharedStore(BatchedSweeperTestSuite):
    """The batched suite twice on one store: the second sweep's six jobs are all skipped, and
    their returns still come in batches with each job's recorded dir."""

    def test_no_config_ran_twice(
        self, class_store: str, launcher_name: str, overrides: list[str]
    ) -> None:
        assert_nothing_ran_twice(class_store)
