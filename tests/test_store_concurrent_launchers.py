"""Several launchers, one store: every config runs once.

Real CLI sweeps of the probe app, started as a user would start the same sweep twice (two
terminals, a job array, a cron job), 0.5 s apart, recording into one sqlite file or one real
``mlflow server`` on loopback.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from furcate_hydra.store import Tags
from tests.process_helpers import killed_if_left, start_probe_sweep
from tests.store_helpers import job_runs, sweep_runs
from tests.test_store_server import mlflow_server

CONFIGS = 8
# 8 configs of 1.5 s on 2 slots: the first launcher is busy ~6 s, well past the second's start.
GRID = ["+i=" + ",".join(map(str, range(CONFIGS))), "sleep=1.5", "hydra.launcher.max_workers=2"]


@contextmanager
def store_uri(kind: str, tmp_path: Path, sqlite_uri: str, template: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield sqlite_uri
        return
    database = tmp_path / "server" / "server.db"
    database.parent.mkdir()
    shutil.copyfile(template, database)  # initialised: a fresh one migrates for seconds
    with mlflow_server(tmp_path / "server", f"sqlite:///{database}") as server:
        yield server.url


def count(pattern: str, output: str) -> int:
    match = re.search(pattern, output)
    return int(match.group(1)) if match else 0


def ran_here(sweep: Path) -> int:
    return len(list(sweep.glob("*/probe.json")))


@pytest.mark.parametrize(
    ("kind", "sweeper"),
    [
        pytest.param("sqlite", "basic", marks=pytest.mark.slow),  # CI; the quick suite: furcate
        pytest.param("server", "basic", marks=pytest.mark.slow),  # + an mlflow server
        ("sqlite", "furcate"),
    ],
)
def test_the_same_sweep_started_twice_runs_each_config_once(
    tmp_path: Path,
    mlflow_store: str,
    empty_mlflow_db: Path,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    sweeper: str,
) -> None:
    """Hydra's basic sweeper launches the whole grid at once: the launcher first to look claims
    what is not finished yet, the other waits for those configs. furcate's grid sweeper takes a
    config per free slot and gives none to a config held elsewhere: the launchers share the
    grid."""
    grid = [*GRID, *(["hydra/sweeper=furcate"] if sweeper == "furcate" else [])]
    with store_uri(kind, tmp_path, mlflow_store, empty_mlflow_db) as uri:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # both launchers inherit it
        folders = [tmp_path / "a", tmp_path / "b"]
        outputs: list[str] = []
        with ExitStack() as stack:
            processes = []
            for folder in folders:
                folder.mkdir()
                started = start_probe_sweep(folder, *grid)
                processes.append(stack.enter_context(killed_if_left(started)))
                time.sleep(0.5)
            for process in processes:
                stdout, stderr = process.communicate(timeout=120)
                outputs.append(stdout.decode() + stderr.decode())
                assert process.returncode == 0, outputs[-1]

        runs = job_runs(uri)
        fingerprints = [r.data.tags[Tags.FINGERPRINT] for r in runs]
        assert len(fingerprints) == len(set(fingerprints)) == CONFIGS, fingerprints
        assert {r.info.status for r in runs} == {"FINISHED"}
        # each config's task ran in exactly one of the two launchers
        executed = [ran_here(folder / "sweep") for folder in folders]
        assert sum(executed) == CONFIGS, executed
        elsewhere = []
        for folder, output, here in zip(folders, outputs, executed, strict=True):
            waited = output.count("running elsewhere: launcher pid")
            elsewhere.append(count(r"(\d+) of 8 configs ran in other launchers", output))
            # the rest: finished before this launcher looked, skipped
            skipped = count(r"skipped (\d+) of 8 configs", output)
            assert here + elsewhere[-1] + skipped == CONFIGS, output
            assert waited == elsewhere[-1], output
            # every job dir says where its config ran: here (probe.json) or in the other sweep
            assert len(list((folder / "sweep").glob("*/run_data.json"))) == CONFIGS
        assert sum(elsewhere) >= 1, "the launchers did not overlap"
        if sweeper == "furcate":
            assert min(executed) >= 1, f"one launcher ran everything: {executed}"
        assert sorted(r.info.status for r in sweep_runs(uri)) == ["FINISHED", "FINISHED"]
