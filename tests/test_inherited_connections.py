"""A fork (the fork server, its jobs) never runs a statement on a database connection its
parent opened; the fork server builds the sweep's MLflow store once, and jobs forked from it
use that store on connections of their own."""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
from mlflow.tracking import MlflowClient

from furcate_hydra.store import (
    build_store_for_forks,
    load_run_for_forks,
    set_aside_inherited_connections,
)
from tests.store_helpers import connections_watched


def in_fork(work: Callable[[], int]) -> int:
    """``work``'s exit status in a fork of this process (1 where it raised)."""
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            status = work()
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(status)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_a_fork_that_sets_aside_what_it_inherited_queries_on_connections_of_its_own(
    mlflow_store: str, tmp_path: Path
) -> None:
    trace = tmp_path / "statements-in-forks.txt"
    with connections_watched(trace):
        client = MlflowClient(mlflow_store)
        client.search_experiments()

        def fork() -> int:
            if set_aside_inherited_connections() < 1:
                return 2
            MlflowClient(mlflow_store).search_experiments()  # MLflow's cached store, reused
            return 0

        assert in_fork(fork) == 0
        assert [e.name for e in client.search_experiments()] == ["Default"]  # still its own
    assert not trace.exists()


def test_the_watch_sees_a_fork_that_queries_on_its_parents_connection(
    mlflow_store: str, tmp_path: Path
) -> None:
    # what the test above would see without the set-aside: MLflow caches its engines, and a
    # fork's new client takes the parent's pooled connection
    trace = tmp_path / "statements-in-forks.txt"
    with connections_watched(trace):
        MlflowClient(mlflow_store).search_experiments()

        def fork() -> int:
            MlflowClient(mlflow_store).search_experiments()
            return 0

        assert in_fork(fork) == 0
    assert "SELECT" in trace.read_text()


def test_jobs_forked_after_the_server_built_the_store_build_none_and_connect_on_their_own(
    mlflow_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = tmp_path / "statements-in-forks.txt"
    with connections_watched(trace):

        def server() -> int:
            set_aside_inherited_connections()
            build_store_for_forks(mlflow_store)
            return in_fork(job)

        def job() -> int:
            built: list[str] = []
            original: Any = SqlAlchemyStore.__init__

            def spy(store: SqlAlchemyStore, *args: Any, **kwargs: Any) -> None:
                built.append(str(args[0]))
                original(store, *args, **kwargs)

            monkeypatch.setattr(SqlAlchemyStore, "__init__", spy)  # in the job's fork only
            experiments = MlflowClient(mlflow_store).search_experiments()
            return 3 if built or [e.name for e in experiments] != ["Default"] else 0

        assert in_fork(server) == 0
    assert not trace.exists()


def test_a_run_the_server_loaded_leaves_it_no_connection_its_jobs_could_share(
    mlflow_store: str, tmp_path: Path
) -> None:
    run_id = MlflowClient(mlflow_store).create_run("0").info.run_id
    trace = tmp_path / "statements-in-forks.txt"
    with connections_watched(trace):

        def server() -> int:
            set_aside_inherited_connections()
            build_store_for_forks(mlflow_store)
            load_run_for_forks(mlflow_store, run_id)
            load_run_for_forks(mlflow_store, "0" * 32)  # no such run: it closes what it used
            return in_fork(job)

        def job() -> int:
            return 0 if MlflowClient(mlflow_store).get_run(run_id).info.run_id == run_id else 3

        assert in_fork(server) == 0
    assert not trace.exists()


def test_a_store_that_cannot_be_opened_is_left_to_the_job(tmp_path: Path) -> None:
    # the fork server goes on; the job that opens the store reports what is wrong
    uri = "nosuchscheme://tracking"
    build_store_for_forks(uri)  # returns: the server starts its jobs
    load_run_for_forks(uri, "0" * 32)
    with pytest.raises(Exception, match="nosuchscheme"):
        MlflowClient(uri)


@pytest.mark.parametrize("lightning_layer", [True, False])
def test_the_server_builds_the_store_only_for_jobs_that_record_into_it(
    mlflow_store: str, lightning_layer: bool
) -> None:
    # a job of an app that trains with Lightning records through furcate's Lightning layer (the
    # server has it loaded); any other job never opens the store: building it would be waste
    code = "\n".join(
        [
            "import sys",
            "from furcate_hydra.job_process.job_context import HydraJobContext",
            "if sys.argv[2] == 'True':",
            "    import furcate_hydra.lightning",
            "context = HydraJobContext(None, None, None, sys.argv[1])",
            "context.prepare()",
            "context.before_fork({'MLFLOW_RUN_ID': '0' * 32})",
            "print('mlflow.store.tracking.sqlalchemy_store' in sys.modules)",
        ]
    )
    done = subprocess.run(
        [sys.executable, "-c", code, mlflow_store, str(lightning_layer)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(lightning_layer)
