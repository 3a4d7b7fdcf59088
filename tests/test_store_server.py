"""Sweeps recording into a real ``mlflow server``: the lookup without SQL, artifacts by proxy."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from furcate_hydra.cli.main import main
from furcate_hydra.store import Tags
from tests.conftest import run_probe_sweep
from tests.store_helpers import artifact_names, job_runs, sweep_runs

START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Server:
    url: str
    pgid: int
    artifacts: Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def answers_health(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_group(process: subprocess.Popen[bytes], timeout_s: float = 15.0) -> None:
    """SIGTERM to the server's whole process group, SIGKILL for whatever outlives it."""
    pgid = process.pid
    if group_alive(pgid):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while group_alive(pgid) and time.monotonic() < deadline:
        process.poll()  # reap the leader; its children are reaped by it
        time.sleep(0.1)
    if group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)
    process.wait(timeout=timeout_s)


@contextmanager
def mlflow_server(tmp_path: Path, backend_uri: str) -> Iterator[Server]:
    """``mlflow server`` on a free loopback port, in its own process group; stopped on exit."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    artifacts = tmp_path / "artifacts"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    # The server's job runner (a pool of worker processes for MLflow's own async jobs) is not
    # what is tested here and doubles the start-up time.
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
    log = tmp_path / "server.log"
    command = [
        *(sys.executable, "-m", "mlflow", "server"),
        *("--host", "127.0.0.1", "--port", str(port), "--workers", "1"),
        *("--backend-store-uri", backend_uri, "--artifacts-destination", str(artifacts)),
    ]
    with log.open("wb") as output:
        process = subprocess.Popen(
            command,
            cwd=tmp_path,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        started = time.monotonic()
        while not answers_health(url):
            if process.poll() is not None or time.monotonic() - started > START_TIMEOUT_S:
                pytest.fail(
                    f"mlflow server did not answer {url}/health within {START_TIMEOUT_S:.0f} s "
                    f"(exit code {process.poll()}):\n{log.read_text()[-5000:]}"
                )
            time.sleep(0.1)
        yield Server(url, process.pid, artifacts)
    finally:
        stop_group(process)


def ran(sweep: Path) -> list[str]:
    return sorted(p.parent.name for p in sweep.glob("*/probe.json"))


@pytest.mark.slow  # an mlflow server and two sweeps
def test_a_sweep_twice_through_an_mlflow_server(
    tmp_path: Path,
    mlflow_store: str,
    empty_mlflow_db: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mlflow.tracking import MlflowClient

    # The server's own database, initialised already (a fresh one migrates for seconds).
    database = tmp_path / "server" / "server.db"
    database.parent.mkdir()
    shutil.copyfile(empty_mlflow_db, database)
    with mlflow_server(tmp_path / "server", f"sqlite:///{database}") as server:
        client = MlflowClient(server.url)
        # A REST store offers no SQL session: the lookup must take its search_runs path.
        assert not hasattr(client._tracking_client.store, "ManagedSessionMaker")
        env = {"MLFLOW_TRACKING_URI": server.url}

        first = run_probe_sweep(
            tmp_path, f"hydra.sweep.dir={tmp_path / 'first'}", "+lr=0.1,0.01", env=env
        )
        assert first.returncode == 0, first.stderr
        assert ran(tmp_path / "first") == ["0", "1"]
        runs = job_runs(server.url)
        (parent,) = sweep_runs(server.url)
        assert [r.info.status for r in runs] == ["FINISHED", "FINISHED"]
        assert parent.info.status == "FINISHED"
        assert {r.data.tags[Tags.PARENT_RUN] for r in runs} == {parent.info.run_id}
        assert sorted(r.data.params["lr"] for r in runs) == ["0.01", "0.1"]
        for run in runs:
            run_id = run.info.run_id
            assert run.info.artifact_uri.startswith("mlflow-artifacts:")
            assert {"stdout.log", "stderr.log", "run_data.json"} <= artifact_names(
                server.url, run_id
            )
            # Read back through the server's artifact proxy, not from the job's folder.
            local = client.download_artifacts(run_id, "run_data.json", str(tmp_path / run_id))
            data = json.loads(Path(local).read_text())
            assert data["run_id"] == run_id and data["status"] == "FINISHED"
            assert Path(data["output_dir"]).parent == tmp_path / "first"
            assert list(server.artifacts.rglob(f"{run_id}/**/run_data.json"))
        # The sweep's environment named the server: nothing went to the sqlite store the test
        # process points at, or to a local ./mlruns.
        assert job_runs(mlflow_store) == []
        assert not (tmp_path / "mlruns").exists()

        second = run_probe_sweep(
            tmp_path, f"hydra.sweep.dir={tmp_path / 'second'}", "+lr=0.1,0.01", env=env
        )
        assert second.returncode == 0, second.stderr
        assert ran(tmp_path / "second") == []
        assert "skipped 2 of 2 configs" in second.stdout + second.stderr
        assert len(job_runs(server.url)) == 2
        assert len(sweep_runs(server.url)) == 2

        # given no sweep dir, and none under ./multirun: the newest the server records
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
        capsys.readouterr()
        assert main(["status", "--json"]) == 0
        found = capsys.readouterr()
        assert json.loads(found.out)["sweep"]["dir"] == str(tmp_path / "second")
        assert found.err == f"newest sweep in {server.url}: second\n"
    assert not group_alive(server.pgid), "mlflow server processes outlived the test"
