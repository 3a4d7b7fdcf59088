"""The launcher's process ends quickly (``hydra.launcher.fast_exit``, on by default): at its
exit the sweep's end is recorded and its stores' connections are closed, then the heap is
frozen so that the interpreter's last collections skip it; ``fast_exit=false`` keeps
Python's usual exit.

Every check runs in a process of its own: a frozen heap and exit handlers would outlive a
test here. What a process sees at its end is written by an exit handler registered before
the launcher's, which therefore runs after it (the tests' own exit hook, which freezes too,
runs later still).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from furcate_hydra.errors import FurcateConfigError
from tests.conftest import APPS, REPO, run_cli
from tests.option_helpers import parse_launcher_options
from tests.store_helpers import all_runs, job_runs, sweep_runs

OBSERVER = """
import atexit, gc, json, os, sys
OUT = sys.argv[1]
seen = []
def observe():
    with open(f"{OUT}.{os.getpid()}", "w") as out:
        json.dump({"calls": seen, "frozen": gc.get_freeze_count(), **extra}, out)
extra = {}
atexit.register(observe)  # before the launcher's handler: runs after it
"""


def run_script(
    tmp_path: Path, body: str
) -> tuple[subprocess.CompletedProcess[str], dict[int, Any]]:
    """``OBSERVER + body`` in a new interpreter; what its observer saw in this process."""
    script = OBSERVER + textwrap.dedent(body)
    out = tmp_path / "seen"
    done = subprocess.run(
        [sys.executable, "-c", script, str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    seen = {int(p.suffix[1:]): json.loads(p.read_text()) for p in tmp_path.glob("seen.*")}
    return done, seen


def test_closers_run_once_in_order_then_the_heap_is_frozen(tmp_path: Path) -> None:
    done, seen = run_script(
        tmp_path,
        """
        from furcate_hydra.quick_exit import close_at_exit, end_quickly

        class Store:
            def __init__(self, name): self.name = name
            def close(self): seen.append(self.name)

        def first(): seen.append("first")
        def failing(): raise RuntimeError("refused on purpose")
        def last(): seen.append("last")

        kept, gone = Store("kept"), Store("gone")
        for closer in (last, first, failing, kept.close, gone.close, last):  # last: moved last
            close_at_exit(closer)
        del gone  # a bound method is held weakly: nothing of it left to close
        end_quickly()
        end_quickly()  # once is enough: its closers still run once
        """,
    )
    ((_, at_end),) = seen.items()
    assert at_end["calls"] == ["first", "kept", "last"]
    assert at_end["frozen"] > 1000  # every object of the interpreter's, out of the GC's reach
    assert "refused on purpose" in done.stderr  # said, and the others still ran


def test_without_end_quickly_nothing_is_closed_or_frozen(tmp_path: Path) -> None:
    _, seen = run_script(
        tmp_path,
        """
        from furcate_hydra.quick_exit import close_at_exit
        close_at_exit(lambda: seen.append("closed"))
        """,
    )
    ((_, at_end),) = seen.items()
    assert at_end == {"calls": [], "frozen": 0}


def test_a_fork_that_exits_normally_does_not_close_its_parents_stores(tmp_path: Path) -> None:
    _, seen = run_script(
        tmp_path,
        """
        from furcate_hydra.quick_exit import close_at_exit, end_quickly
        close_at_exit(lambda: seen.append(os.getpid()))
        end_quickly()
        child = os.fork()
        if child:
            os.waitpid(child, 0)
        """,
    )
    assert len(seen) == 2  # the parent's observer and the fork's
    (parent,) = [pid for pid, at_end in seen.items() if at_end["calls"]]
    (fork,) = set(seen) - {parent}
    assert seen[parent]["calls"] == [parent] and seen[parent]["frozen"] > 0
    assert seen[fork] == {"calls": [], "frozen": 0}


def test_an_optuna_storage_is_closed_before_the_freeze(tmp_path: Path) -> None:
    _, seen = run_script(
        tmp_path,
        f"""
        import optuna
        from furcate_hydra.quick_exit import end_quickly
        from furcate_hydra.tuning.storage import rdb_storage

        storage = rdb_storage("sqlite:///{tmp_path / "optuna.db"}")
        optuna.create_study(storage=storage, study_name="s").optimize(lambda t: 1.0, n_trials=1)
        extra["open_before"] = storage.engine.pool.checkedin()
        atexit.register(lambda: extra.update(open_at_end=storage.engine.pool.checkedin()))
        end_quickly()
        """,
    )
    ((_, at_end),) = seen.items()
    assert at_end["open_before"] >= 1  # the pooled connection the study used
    assert at_end["open_at_end"] == 0 and at_end["frozen"] > 0


def sweep_exit_app(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    """``exit_app.py -m`` under the furcate launcher through the CLI, its sweep dir
    ``tmp_path/sweep``, what it saw at its end in ``tmp_path/exit.json``."""
    return run_cli(
        APPS / "exit_app.py",
        "-m",
        "hydra/launcher=furcate",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        *overrides,
        cwd=tmp_path,
        env={**os.environ, "EXIT_REPORT": str(tmp_path / "exit.json")},
    )


@pytest.mark.parametrize("fast_exit", [True, False])
def test_a_cli_sweep_records_its_end_and_closes_its_store_before_the_freeze(
    tmp_path: Path, mlflow_store: str, fast_exit: bool
) -> None:
    store = tmp_path / "mlflow.db"  # the fixture's
    done = sweep_exit_app(tmp_path, "+i=0,1", f"hydra.launcher.fast_exit={str(fast_exit).lower()}")
    assert done.returncode == 0, done.stderr
    at_end = json.loads((tmp_path / "exit.json").read_text())
    if fast_exit:
        # every connection closed (sqlite folded the WAL into the store), then frozen
        assert at_end == {"frozen": at_end["frozen"], "wal_left": False}
        assert at_end["frozen"] > 1000
        assert not Path(f"{store}-wal").exists()  # and so it stays once the process is gone
    else:  # Python's usual exit: the connections close later, in the interpreter's teardown
        assert at_end == {"frozen": 0, "wal_left": True}
    assert len(sweep_runs(mlflow_store)) == 1 and len(job_runs(mlflow_store)) == 2
    # every run ended as FINISHED: the sweep's end was recorded before its store was closed
    ended = {(run.info.status, run.info.end_time is not None) for run in all_runs(mlflow_store)}
    assert ended == {("FINISHED", True)}


def test_the_furcate_command_closes_the_store_it_read_before_the_freeze(
    tmp_path: Path, mlflow_store: str
) -> None:
    store = tmp_path / "mlflow.db"  # the fixture's
    assert sweep_exit_app(tmp_path, "+i=0").returncode == 0
    assert not Path(f"{store}-wal").exists()  # the sweep's launcher closed it
    done, seen = run_script(
        tmp_path,
        f"""
        from pathlib import Path
        os.environ["MLFLOW_TRACKING_URI"] = {mlflow_store!r}
        wal = Path({str(store)!r} + "-wal")
        atexit.register(lambda: extra.update(wal_at_end=wal.exists()))  # after the command's
        from furcate_hydra.cli.main import main
        extra["code"] = main(["ls"])  # MLflow opens the store (WAL journaling: a -wal file)
        extra["wal_while_open"] = wal.exists()
        """,
    )
    ((_, at_end),) = seen.items()
    assert at_end["code"] == 0 and str(tmp_path / "sweep") in done.stdout
    assert at_end["wal_while_open"] is True
    assert at_end["wal_at_end"] is False and at_end["frozen"] > 1000


def test_a_fast_exit_that_is_not_a_flag_stops_the_cli(tmp_path: Path) -> None:
    done = sweep_exit_app(tmp_path, "+i=0", "hydra.launcher.fast_exit=maybe")
    assert done.returncode != 0
    assert "fast_exit" in done.stderr and "maybe" in done.stderr
    assert not (tmp_path / "sweep").exists()


def test_a_fast_exit_that_reaches_the_launcher_unchecked_is_named_with_the_fix() -> None:
    # (a YAML word such as yes is a boolean to Hydra's schema; a mapping made in code is not)
    with pytest.raises(FurcateConfigError) as raised:
        parse_launcher_options({"fast_exit": "yes", "mlflow": {"enabled": False}})
    message = str(raised.value)
    assert "Invalid hydra.launcher.fast_exit='yes'" in message and "true or false" in message
    assert "Fix: set hydra.launcher.fast_exit=true" in message
