"""Shared helpers: run the test apps through the real CLI, or drive the launcher and the Optuna
sweeper in-process."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hydra._internal.callbacks import Callbacks
from hydra._internal.hydra import Hydra
from hydra._internal.utils import create_config_search_path
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn
from hydra.types import HydraContext, RunMode
from omegaconf import OmegaConf

APPS = Path(__file__).parent / "apps"
REPO = Path(__file__).parent.parent
# every process the tests start (and pytest's workers) skips the interpreter's last garbage
# collection at its exit: ~0.7 s of CPU each that imported Lightning (interpreter_exit/)
_EXIT_HOOK = str(Path(__file__).parent / "interpreter_exit")
if _EXIT_HOOK not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(
        entry for entry in (_EXIT_HOOK, os.environ.get("PYTHONPATH")) if entry
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    """Under ``--dist loadgroup`` (pyproject's addopts), a worker's test marked ``xdist_group``
    carries its group in its node id: that is how xdist keeps a group on one worker. A pytest
    that drops it (pytest-xdist issue 1386, pytest 9.2) spreads a group over both workers
    without a word, and the tests that share a store or a cluster then fail by chance."""
    if not session.config.getoption("loadgroup", default=False):
        return  # not an xdist worker under loadgroup
    lost = [
        item.nodeid
        for item in session.items
        if item.get_closest_marker("xdist_group") and "@" not in item.nodeid
    ]
    if lost:
        raise pytest.UsageError(
            f"--dist loadgroup lost the xdist_group of {len(lost)} tests (e.g. {lost[0]}) with "
            f"pytest {pytest.__version__}: install the dev extra's pytest (below 9.2)"
        )


def run_cli(
    script: Path,
    *overrides: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """Run a Hydra app exactly as a user would, in its own interpreter."""
    return subprocess.run(
        [sys.executable, str(script), *overrides],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def furcate_status(
    sweep: Path, *, cwd: Path | None = None, env: dict[str, str] | None = None
) -> str:
    """``furcate status <sweep>`` as a user runs it, in its own interpreter: its output, once
    it exited 0."""
    done = subprocess.run(
        [sys.executable, "-m", "furcate_hydra.cli", "status", str(sweep)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def run_probe_sweep(
    tmp_path: Path, *overrides: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python probe_app.py -m <overrides>`` with its sweep dir at ``tmp_path / "sweep"``."""
    return run_cli(
        APPS / "probe_app.py",
        "-m",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        *overrides,
        cwd=tmp_path,
        env=None if env is None else {**os.environ, **env},
    )


def copy_probe_app(where: Path) -> Path:
    """The probe app and its configs copied into ``where`` (an app of its own to edit); its
    script. ``--config-name own_dirs`` puts its sweep dirs under logs/train/multiruns/."""
    shutil.copytree(APPS / "conf", where / "conf")
    shutil.copy(APPS / "probe_app.py", where / "probe_app.py")
    return where / "probe_app.py"


def sweep_in_own_dirs(app: Path, *overrides: str) -> tuple[Path, str]:
    """``python probe_app.py -m --config-name own_dirs <overrides>`` in ``app`` (made by
    ``copy_probe_app``): the sweep dir it made under logs/train/multiruns/, and its output."""
    multiruns = app / "logs" / "train" / "multiruns"
    before = set(multiruns.iterdir()) if multiruns.is_dir() else set()
    if before:
        # the dir is named by the second the sweep starts: a sweep right after another (one
        # that skipped everything takes about a second) would reuse its dir
        time.sleep(1.05 - time.time() % 1)
    script = app / "probe_app.py"
    result = run_cli(script, "-m", "--config-name", "own_dirs", *overrides, cwd=app)
    assert result.returncode == 0, result.stderr
    (made,) = set(multiruns.iterdir()) - before
    return made, result.stdout + result.stderr


def run_optuna_study(
    tmp_path: Path, *overrides: str, sweep: str = "sweep"
) -> subprocess.CompletedProcess[str]:
    """``python optuna_app.py -m <overrides>`` in ``tmp_path`` (its optuna.db and mlflow.db),
    with its sweep dir at ``tmp_path / sweep``."""
    return run_cli(
        APPS / "optuna_app.py",
        "-m",
        f"hydra.sweep.dir={tmp_path / sweep}",
        *overrides,
        cwd=tmp_path,
    )


def run_sphere_config(
    tmp_path: Path, config_name: str, *overrides: str
) -> subprocess.CompletedProcess[str]:
    """hydra-optuna-sweeper's example app, ``tests/apps/sphere/sphere.py -m``, with one of the
    configs beside it, in ``tmp_path`` and its sweep dir at ``tmp_path / "sweep"``."""
    return run_cli(
        APPS / "sphere" / "sphere.py",
        f"--config-name={config_name}",
        "-m",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        *overrides,
        cwd=tmp_path,
    )


@pytest.fixture(scope="session")
def empty_mlflow_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An initialised, empty MLflow sqlite store; copying it skips ~1.5 s of migrations."""
    from mlflow.tracking import MlflowClient

    from furcate_hydra.known_warnings import ignore_mlflow_sqlalchemy_deprecation

    ignore_mlflow_sqlalchemy_deprecation()  # as the store does: this client loads MLflow first
    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture(scope="session")
def unrequested_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A sqlite store in a folder that is never created: furcate refuses it before any job runs,
    naming the folder, so a test that launches jobs without ``mlflow_store`` fails at once."""
    folder = tmp_path_factory.getbasetemp() / "no-store-ask-for-the-mlflow_store-fixture"
    return f"sqlite:///{folder / 'mlflow.db'}"


@pytest.fixture(scope="session")
def template_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tests' cache of new-store templates: not the user's (``store_template``)."""
    return tmp_path_factory.mktemp("furcate-cache")


@pytest.fixture(autouse=True)
def no_outside_store(
    unrequested_store: str, template_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No test records into the MLFLOW_TRACKING_URI of the shell that runs pytest, nor keeps
    a template in the user's cache."""
    from furcate_hydra.store.store_template import CACHE_VAR

    monkeypatch.setenv("MLFLOW_TRACKING_URI", unrequested_store)
    monkeypatch.setenv(CACHE_VAR, str(template_cache))


@pytest.fixture
def mlflow_store(
    no_outside_store: None, tmp_path: Path, empty_mlflow_db: Path, monkeypatch: pytest.MonkeyPatch
) -> str:
    """The test's own sqlite store in tmp_path, named by MLFLOW_TRACKING_URI (jobs inherit it).

    Tests that launch jobs or read MLflow ask for it (as an argument, or a module's
    ``pytestmark = pytest.mark.usefixtures("mlflow_store")``); pure unit tests pay nothing.
    """
    path = tmp_path / "mlflow.db"
    shutil.copyfile(empty_mlflow_db, path)
    uri = f"sqlite:///{path}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


class LaunchJobs:
    """Compose the probe app's config and call the furcate launcher's ``launch`` directly.

    Everything but the sweeper is real (config loading, plugin instantiation, the launcher, its
    fork server and job processes), so tests can look at each JobReturn, even failed ones that
    Hydra's BasicSweeper would turn into an exception.
    """

    def __init__(self, sweep_dir: Path) -> None:
        self.sweep_dir = sweep_dir
        self.launchers: list[Any] = []
        self.task_function = importlib.import_module("probe_app").main.__wrapped__

    def __call__(
        self, job_overrides: Sequence[Sequence[str]], overrides: Sequence[str]
    ) -> list[JobReturn]:
        GlobalHydra.instance().clear()
        hydra = Hydra.create_main_hydra2(
            task_name="probe_app", config_search_path=create_config_search_path(str(APPS / "conf"))
        )
        config = hydra.compose_config(
            "probe",
            [f"hydra.sweep.dir={self.sweep_dir}", *overrides],
            run_mode=RunMode.MULTIRUN,
            with_log_configuration=False,
        )
        HydraConfig.instance().set_config(config)
        context = HydraContext(config_loader=hydra.config_loader, callbacks=Callbacks(config))
        launcher = Plugins.instance().instantiate_launcher(
            hydra_context=context, task_function=self.task_function, config=config
        )
        self.launchers.append(launcher)
        return list(launcher.launch(job_overrides, initial_job_idx=0))

    @property
    def last(self) -> Any:
        """The launcher of the latest call, with its pool still warm."""
        return self.launchers[-1]

    def close(self) -> None:
        for launcher in self.launchers:
            launcher.close()


class RunStudy:
    """``optuna_app.py -m <overrides>`` run by Hydra in this process: Hydra's multirun with the
    real furcate_optuna sweeper, launcher, fork server, job processes and stores, without an
    interpreter of its own (as ``run_optuna_study`` runs it, in the working directory).
    """

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.task_function = importlib.import_module("optuna_app").main.__wrapped__

    def __call__(self, *overrides: str, sweep: str = "sweep") -> Any:
        """The sweep's returns; raises what the CLI would report."""
        GlobalHydra.instance().clear()
        hydra = Hydra.create_main_hydra2(
            task_name="optuna_app", config_search_path=create_config_search_path(str(APPS / "conf"))
        )
        # Hydra.multirun, keeping hold of the sweeper to stop its launcher at the end, as the
        # CLI's process does when it exits
        config = hydra.compose_config(
            "optuna",
            [f"hydra.sweep.dir={self.tmp_path / sweep}", *overrides],
            run_mode=RunMode.MULTIRUN,
            with_log_configuration=False,
        )
        callbacks = Callbacks(config)
        callbacks.on_multirun_start(config=config, config_name="optuna")
        sweeper = Plugins.instance().instantiate_sweeper(
            config=config,
            hydra_context=HydraContext(config_loader=hydra.config_loader, callbacks=callbacks),
            task_function=self.task_function,
        )
        task_overrides = OmegaConf.to_container(config.hydra.overrides.task, resolve=False)
        assert isinstance(task_overrides, list)
        try:
            returns = sweeper.sweep(arguments=task_overrides)
        finally:
            launcher = getattr(sweeper, "launcher", None)
            if launcher is not None and hasattr(launcher, "close"):
                launcher.close()
            GlobalHydra.instance().clear()
        callbacks.on_multirun_end(config=config, config_name="optuna")
        return returns


@pytest.fixture
def run_study_in_process(
    tmp_path: Path,
    hydra_restore_singletons: Any,
    mlflow_store: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[RunStudy]:
    """Runs record into the test's own store; the study goes to optuna.db in tmp_path."""
    monkeypatch.chdir(tmp_path)
    sys.path.insert(0, str(APPS))  # the fork server inherits sys.path and imports optuna_app
    try:
        yield RunStudy(tmp_path)
    finally:
        sys.path.remove(str(APPS))


@pytest.fixture
def launch_jobs(
    tmp_path: Path, hydra_restore_singletons: Any, mlflow_store: str
) -> Iterator[LaunchJobs]:
    """Every launch records its jobs, into the test's own store."""
    sys.path.insert(0, str(APPS))  # the fork server inherits sys.path and imports probe_app
    harness = LaunchJobs(tmp_path / "sweep")
    try:
        yield harness
    finally:
        harness.close()
        sys.path.remove(str(APPS))


@pytest.fixture(scope="module")
def slurm() -> Iterator[Any]:
    """A real single-node Slurm with four fake GPUs, for the tests of one module (skipped,
    saying why, where Slurm or root is missing); see tests/slurm_cluster.py."""
    from tests.slurm_cluster import slurm_cluster

    with slurm_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def postgres() -> Iterator[Any]:
    """A real PostgreSQL on loopback for the tests of one module (tests/slurm_cluster.py)."""
    from tests.slurm_cluster import postgres_server

    with postgres_server() as server:
        yield server


@pytest.fixture
def pg_mlflow(postgres: Any, tmp_path: Path) -> Iterator[Any]:
    """An ``mlflow server`` on loopback backed by a database of its own in ``postgres``."""
    from tests.test_store_server import mlflow_server

    (tmp_path / "server").mkdir()
    database = postgres.create_database(f"mlflow_{tmp_path.name.lower()[-20:]}")
    with mlflow_server(tmp_path / "server", database) as running:
        yield running
