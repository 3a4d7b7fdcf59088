"""``hydra.launcher.backend=ray`` end to end: real Hydra CLI sweeps on a real two-node Ray
cluster on loopback (declared GPUs, no hardware), recording into a real ``mlflow server``."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.conftest import APPS, REPO, run_cli
from tests.process_helpers import killed_if_left
from tests.ray_cluster import (
    RAY_ENV,
    RAY_MISSING,
    Cluster,
    kill_newest_node,
    loopback_only,
    ray_cluster,
)
from tests.test_store_server import Server, mlflow_server

pytest.importorskip("ray", reason=RAY_MISSING)

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.xdist_group("ray")]

APP = APPS / "ray_probe_app.py"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Two nodes, 2 CPUs and 2 declared GPUs each: one for the whole module (CPU is scarce)."""
    with ray_cluster(num_gpus=2, worker_nodes=1) as started:
        yield started


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, empty_mlflow_db: Path) -> Iterator[Server]:
    """The store every node reaches: with an address, a sqlite file would be refused."""
    folder = tmp_path_factory.mktemp("mlflow-server")
    database = folder / "server.db"
    shutil.copyfile(empty_mlflow_db, database)
    with mlflow_server(folder, f"sqlite:///{database}") as started:
        yield started


def sweep_command(tmp_path: Path, cluster: Cluster, name: str = "sweep") -> list[str]:
    """The app on the cluster, its runs in an experiment of the test's own."""
    return [
        *("-m", f"hydra.sweep.dir={tmp_path / name}", "hydra.launcher.backend=ray"),
        f"hydra.launcher.ray.address={cluster.address}",
        f"hydra.launcher.mlflow.experiment_name={tmp_path.name}",
        "hydra.launcher.progress=plain",
    ]


def sweep(
    tmp_path: Path, cluster: Cluster, server: Server, *overrides: str, name: str = "sweep"
) -> subprocess.CompletedProcess[str]:
    return run_cli(
        APP,
        *sweep_command(tmp_path, cluster, name),
        *overrides,
        cwd=tmp_path,
        env={**os.environ, **RAY_ENV, "MLFLOW_TRACKING_URI": server.url},
    )


def run_statuses(server: Server, experiment: str) -> list[str]:
    """The statuses of the job runs (not the sweep's) in one experiment, sorted."""
    from mlflow.tracking import MlflowClient

    from furcate_hydra.store import Tags

    client = MlflowClient(server.url)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no experiment {experiment!r}"
    runs = client.search_runs([found.experiment_id])
    return sorted(r.info.status for r in runs if r.data.tags.get(Tags.ROLE) != "sweep")


def opened_runs(server: Server, experiment: str) -> int:
    """Job runs opened for their jobs (a won claim: its params logged), 0 before any."""
    from mlflow.tracking import MlflowClient

    from furcate_hydra.store import Tags

    client = MlflowClient(server.url)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return 0
    runs = client.search_runs([found.experiment_id])
    return sum(1 for r in runs if r.data.tags.get(Tags.ROLE) != "sweep" and r.data.params)


def probes(sweep_dir: Path) -> dict[int, dict[str, object]]:
    return {int(p.parent.name): json.loads(p.read_text()) for p in sweep_dir.glob("*/probe.json")}


def fork_servers(cluster: Cluster) -> list[int]:
    """Fork servers and their jobs (forks with the same command line) on the cluster."""
    found = []
    for process in cluster.processes():
        try:
            if "forkserver.entry" in " ".join(process.cmdline()):
                found.append(process.pid)
        except Exception:
            continue
    return found


def test_a_grid_sweep_runs_on_both_nodes_and_a_rerun_skips_it(
    tmp_path: Path, cluster: Cluster, server: Server
) -> None:
    # every socket of the nodes, their workers and the launcher stays on loopback
    with loopback_only(cluster, APP):
        done = sweep(
            tmp_path,
            cluster,
            server,
            *("hydra.launcher.jobs_per_gpu=2", "+lr=1,2,3,4,5,6", "mode=print"),
        )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "8 Ray slots (0.5 GPU each) on 2 nodes" in out
    ran = probes(tmp_path / "sweep")
    assert sorted(ran) == [0, 1, 2, 3, 4, 5]
    # Ray chose each job's GPU: exactly one, of its node; each job a fresh process
    assert {str(p["cuda_visible_devices"]) for p in ran.values()} <= {"0", "1"}
    assert len({p["pid"] for p in ran.values()}) == 6
    for num in ran:
        job_dir = tmp_path / "sweep" / str(num)
        assert (job_dir / ".hydra" / "config.yaml").exists()
        assert f"job {num} says hello" in (job_dir / "stdout.log").read_text()
        data = json.loads((job_dir / "run_data.json").read_text())
        assert data["status"] == "FINISHED"
    assert "says hello from slot" in out  # echoed through Ray's log forwarding
    assert run_statuses(server, tmp_path.name) == ["FINISHED"] * 6

    again = sweep(tmp_path, cluster, server, "+lr=1,2,3,4,5,6", "mode=print", name="again")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "skipped 6 of 6 configs" in again.stdout + again.stderr
    assert probes(tmp_path / "again") == {}


def test_a_killed_slot_actor_is_a_crash_naming_the_node_and_a_retry_recovers(
    tmp_path: Path, cluster: Cluster, server: Server
) -> None:
    done = sweep(
        tmp_path,
        cluster,
        server,
        "hydra.launcher.max_retries=1",
        "hydra.launcher.max_workers=2",
        f"+marker_dir={tmp_path}",
        "mode=kill_slot,kill_slot_once",
    )
    out = done.stdout + done.stderr
    assert done.returncode != 0  # Hydra's basic sweeper raises for the failed job
    crashed = json.loads((tmp_path / "sweep" / "0" / "run_data.json").read_text())
    assert crashed["status"] == "FAILED"
    assert "the Ray worker of slot" in crashed["error"]
    # the node by the address it registered with (loopback, see tests/ray_loopback.py), and id
    assert re.search(
        r"the Ray worker of slot \d on node 127\.0\.0\.1 \([0-9a-f]{12}\) died", crashed["error"]
    )
    recovered = json.loads((tmp_path / "sweep" / "1" / "run_data.json").read_text())
    assert recovered["status"] == "FINISHED", out
    assert recovered["return_value"] == "recovered"
    assert "retry 1 of 1" in out


def test_a_preempted_remote_job_runs_again_in_its_run(
    tmp_path: Path, cluster: Cluster, server: Server
) -> None:
    """SIGTERM from outside the launcher (as a scheduler on that node sends it): queued again.
    The marker folder reaches the jobs through ``ray.runtime_env``, not the launcher's
    environment, which Ray nodes do not inherit."""
    markers = tmp_path / "markers"
    markers.mkdir()
    done = sweep(
        tmp_path,
        cluster,
        server,
        f"hydra.launcher.ray.runtime_env={{env_vars:{{PROBE_MARKER_DIR:'{markers}'}}}}",
        "mode=ok,sigterm_once",
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "queued again to resume (preemption 1 of 3)" in out
    data = json.loads((tmp_path / "sweep" / "1" / "run_data.json").read_text())
    assert (data["status"], data["return_value"]) == ("FINISHED", "recovered"), out
    assert (data["attempts"], data["preemptions"]) == (2, 1)
    assert run_statuses(server, tmp_path.name) == ["FINISHED", "FINISHED"]


def test_ctrl_c_stops_every_remote_job(tmp_path: Path, cluster: Cluster, server: Server) -> None:
    command = [
        *(sys.executable, str(APP), *sweep_command(tmp_path, cluster)),
        *("hydra.launcher.max_workers=2", "+lr=1,2,3", "sleep=600"),
    ]
    env = {**os.environ, **RAY_ENV, "MLFLOW_TRACKING_URI": server.url}
    process = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    with killed_if_left(process):
        deadline = time.monotonic() + 120
        # two jobs run: two fork servers and a job forked from each
        while len(fork_servers(cluster)) < 4 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert len(fork_servers(cluster)) >= 4, "the jobs did not start"
        # each job's run is opened just before it is submitted: the queued one's may come
        # after the first two started (a Ctrl-C before it would withdraw its claim instead)
        while opened_runs(server, tmp_path.name) < 3 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert opened_runs(server, tmp_path.name) == 3, "the queued job's run was not opened"
        os.killpg(process.pid, signal.SIGINT)
        output, _ = process.communicate(timeout=120)
    text = output.decode()
    assert process.returncode == 128 + signal.SIGINT, text
    assert "stopped and recorded as KILLED" in text
    deadline = time.monotonic() + 30
    while fork_servers(cluster) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert fork_servers(cluster) == [], "a job or fork server outlived the Ctrl-C"
    # the two running and the queued one, whose run was opened when it was submitted
    assert run_statuses(server, tmp_path.name) == ["KILLED"] * 3


def test_a_remote_job_is_recorded_with_its_pid_and_node_as_it_starts(
    tmp_path: Path, cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """The slot actor tells the pool the job's pid as soon as it is forked: run_data.json has
    it while the job runs, so ``furcate status`` with MLflow off sees a live job, not an
    interrupted one."""
    from furcate_hydra.cli.main import main

    command = [
        *(sys.executable, str(APP), *sweep_command(tmp_path, cluster)),
        *("hydra.launcher.mlflow.enabled=false", "hydra.launcher.max_workers=1", "sleep=600"),
    ]
    process = subprocess.Popen(
        command,
        cwd=tmp_path,
        env={**os.environ, **RAY_ENV},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    run_data = tmp_path / "sweep" / "0" / "run_data.json"
    with killed_if_left(process):
        deadline = time.monotonic() + 120
        data: dict[str, object] = {}
        while not data.get("pid") and time.monotonic() < deadline:
            time.sleep(0.3)
            with contextlib.suppress(OSError, ValueError):
                data = json.loads(run_data.read_text())
        assert data.get("pid"), f"no pid in run_data.json while the job runs: {data}"
        assert (data["status"], data["node"]) == ("RUNNING", "127.0.0.1")
        # the job's own process, forked on its node by the slot's fork server
        job = psutil.Process(int(str(data["pid"])))
        assert "forkserver.entry" in " ".join(job.cmdline())
        assert job.pid in {p.pid for p in cluster.processes()}
        capsys.readouterr()
        assert main(["status", str(tmp_path / "sweep"), "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["jobs"][0]["status"] == "RUNNING", shown
        os.killpg(process.pid, signal.SIGINT)
        process.communicate(timeout=120)
    assert json.loads(run_data.read_text())["pid"] == data["pid"]


def test_optuna_trials_fill_ray_slots_and_are_pruned_from_their_jobs(
    tmp_path: Path, mlflow_store: str
) -> None:
    """examples/optuna_pruning on Ray. Without an address the launcher starts Ray here (no
    GPU: CPU slots), where the sqlite study and store are fine: every node is this machine.
    Each Lightning job reports to the study from its own process and stops when pruned."""
    import optuna

    example = REPO / "examples" / "optuna_pruning" / "optuna_pruning.py"
    with loopback_only(None, example) as sockets:  # the launcher's own Ray instance too
        done = run_cli(
            example,
            *("-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.launcher.backend=ray"),
            *("hydra.launcher.gpus=null", "hydra.launcher.max_workers=2"),
            cwd=tmp_path,
            env={**os.environ, **RAY_ENV},
        )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "2 Ray slots (no GPU, 1 CPU each) on 1 node of a Ray instance on this machine" in out
    assert out.count("Started a local Ray instance") == 1, "Ray was started again at exit"
    # what the sweep relies on, said once at launch
    private = "Ray's own ports (the Ray instance started on this machine) take work from whoever"
    assert out.count(private) == 1, out[-4000:]
    # the instance the launcher started reports no usage stats (they ask 169.254.169.254)
    assert sockets.usage_stats == {"0"}, sockets.usage_stats
    study = optuna.load_study(
        study_name="optuna_pruning", storage=f"sqlite:///{tmp_path / 'optuna.db'}"
    )
    states = [t.state.name for t in study.get_trials(deepcopy=False)]
    assert set(states) <= {"COMPLETE", "PRUNED"}, states
    assert "PRUNED" in states and "COMPLETE" in states, states


def test_optuna_jobs_on_a_cluster_are_pruned_through_the_sweepers_proxy(
    tmp_path: Path, cluster: Cluster, server: Server
) -> None:
    """examples/optuna_pruning on the two-node cluster, with its default sqlite study: the
    sweeper serves it through Optuna's gRPC proxy on the address toward the head (loopback
    here), each Lightning job reports to its trial through it, and it stops with the sweep."""
    import optuna

    example = REPO / "examples" / "optuna_pruning" / "optuna_pruning.py"
    with loopback_only(cluster, example):
        done = run_cli(
            example,
            *sweep_command(tmp_path, cluster),
            *("hydra.launcher.gpus=null", "hydra.launcher.max_workers=2"),
            cwd=tmp_path,
            env={**os.environ, **RAY_ENV, "MLFLOW_TRACKING_URI": server.url},
        )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    served = re.search(r"the study is served to the Ray nodes at (grpc://127\.0\.0\.1:\d+)", out)
    assert served, out[-4000:]
    assert f"stopped serving the study at {served.group(1)}" in out
    study = optuna.load_study(
        study_name="optuna_pruning", storage=f"sqlite:///{tmp_path / 'optuna.db'}"
    )
    trials = study.get_trials(deepcopy=False)
    states = [t.state.name for t in trials]
    assert set(states) <= {"COMPLETE", "PRUNED"}, states
    assert "PRUNED" in states and "COMPLETE" in states, states
    # every epoch a job ran reached its trial through the proxy
    assert all(t.intermediate_values for t in trials)
    assert run_statuses(server, tmp_path.name).count("FINISHED") == len(trials)


def test_a_lost_node_fails_its_job_naming_the_node_and_the_sweep_ends(
    tmp_path: Path, server: Server
) -> None:
    """Its own cluster: the only GPU is on a worker node, which is then killed whole."""
    with ray_cluster(num_gpus=1, worker_nodes=1, head_gpus=0) as cluster:
        command = [
            *(sys.executable, str(APP), *sweep_command(tmp_path, cluster)),
            *("hydra.launcher.ray.start_timeout_s=20", "+lr=1", "sleep=600"),
        ]
        env = {**os.environ, **RAY_ENV, "MLFLOW_TRACKING_URI": server.url}
        process = subprocess.Popen(
            command,
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        with killed_if_left(process):
            deadline = time.monotonic() + 120
            while len(fork_servers(cluster)) < 2 and time.monotonic() < deadline:
                time.sleep(0.5)
            assert len(fork_servers(cluster)) >= 2, "the job did not start"
            kill_newest_node(cluster)
            output, _ = process.communicate(timeout=240)
    text = output.decode()
    assert process.returncode != 0, text
    data = json.loads((tmp_path / "sweep" / "0" / "run_data.json").read_text())
    assert data["status"] == "FAILED", text
    assert re.search(
        r"the Ray worker of slot 0 on node 127\.0\.0\.1 \([0-9a-f]{12}\) died", data["error"]
    )
    assert run_statuses(server, tmp_path.name) == ["FAILED"]
