"""DeprecationWarnings as errors: ours fail the tests, known third-party ones stay quiet."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from furcate_hydra.known_warnings import (
    ignore_lightning_pytree_deprecation,
    ignore_mlflow_sqlalchemy_deprecation,
)
from tests.conftest import run_probe_sweep
from tests.sweeper_helpers import ran_jobs

AS_ERRORS = {"PYTHONWARNINGS": "error::DeprecationWarning"}


def test_a_sweep_runs_with_deprecation_warnings_as_errors(
    tmp_path: Path, mlflow_store: str
) -> None:
    # The launcher opens its MLflow store (MLflow's SQL store warns when it loads), the grid
    # sweeper plans and watches, the fork server and the jobs inherit the setting.
    result = run_probe_sweep(tmp_path, "hydra/sweeper=furcate", "+i=0,1", env=AS_ERRORS)
    assert result.returncode == 0, result.stderr
    assert list(ran_jobs(tmp_path / "sweep")) == [0, 1]
    assert "Warning" not in result.stderr


@pytest.mark.slow  # several CLI sweeps in a row
def test_the_jobs_mlflow_logger_opens_its_store_with_deprecation_warnings_as_errors(
    mlflow_store: str,
) -> None:
    # In a job, the first client of the store is the one Lightning's MLflow logger builds.
    code = (
        "from furcate_hydra.lightning import RunBoundMLFlowLogger\n"
        f"RunBoundMLFlowLogger({mlflow_store!r}, 'no-such-run')\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def test_a_deprecation_warning_from_our_modules_fails_a_test() -> None:
    # pyproject's filterwarnings: the module field is a regex matched against the start of the
    # name of the module that called warnings.warn, so it must name our packages exactly.
    def warn_from(module: str) -> None:
        code = compile("import warnings; warnings.warn('old', DeprecationWarning)", module, "exec")
        exec(code, {"__name__": module})

    for ours in ("furcate_hydra.store.run_store", "hydra_plugins.furcate_launcher.x"):
        with pytest.raises(DeprecationWarning):
            warn_from(ours)
    for theirs in ("furcate_hydra_extras", "hydra_plugins.hydra_joblib_launcher", "mlflow"):
        with warnings.catch_warnings(record=True) as caught:
            warn_from(theirs)
        assert [w.category for w in caught] == [DeprecationWarning], theirs


def test_only_mlflows_noload_deprecation_is_ignored() -> None:
    from sqlalchemy.exc import SADeprecationWarning

    noload = "The ``noload`` loader strategy is deprecated and will be removed"
    store = "mlflow.store.tracking.sqlalchemy_store"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ignore_mlflow_sqlalchemy_deprecation()
        warnings.warn_explicit(noload, SADeprecationWarning, "sqlalchemy_store.py", 1, store)
        with pytest.raises(SADeprecationWarning):  # the same warning from anywhere else
            warnings.warn_explicit(noload, SADeprecationWarning, "app.py", 1, "my_app")
        with pytest.raises(SADeprecationWarning):  # another deprecation in MLflow's store
            warnings.warn_explicit("x is deprecated", SADeprecationWarning, "s.py", 1, store)
        with pytest.raises(DeprecationWarning):  # the message in another category
            warnings.warn_explicit(noload, DeprecationWarning, "sqlalchemy_store.py", 1, store)


def test_only_lightnings_leafspec_deprecation_is_ignored() -> None:
    leafspec = (
        "`isinstance(treespec, LeafSpec)` is deprecated, use `isinstance(treespec, TreeSpec) "
        "and treespec.is_leaf()` instead."
    )
    lightning = "pytorch_lightning.utilities._pytree"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ignore_lightning_pytree_deprecation()
        warnings.warn_explicit(leafspec, FutureWarning, "_pytree.py", 21, lightning)
        with pytest.raises(FutureWarning):  # a LeafSpec built anywhere else
            warnings.warn_explicit(leafspec, FutureWarning, "app.py", 1, "my_app")
        with pytest.raises(FutureWarning):  # another deprecation in the same module
            warnings.warn_explicit("x is deprecated", FutureWarning, "_pytree.py", 1, lightning)
        with pytest.raises(DeprecationWarning):  # the message in another category
            warnings.warn_explicit(leafspec, DeprecationWarning, "_pytree.py", 21, lightning)
