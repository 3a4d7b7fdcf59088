"""A real Ray cluster on loopback for tests: ``ray start`` nodes, stopped by their own pids.

``ray stop`` would stop every Ray process of the machine (other sweeps' too), so each cluster
has its own temp dir, and teardown stops exactly the processes whose command line names it,
with their descendants (the workers, the slot actors and their fork servers).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO

# Loopback-only test clusters: no token (Ray 2.60 makes one per machine by default, in ~).
# The launcher under test gets the same, through the environment of its CLI run.
RAY_ENV = {"RAY_AUTH_MODE": "disabled"}
RAY_MISSING = "Ray is not installed: pip install 'furcate-hydra[ray]' to run the Ray tests"


def ray_cli() -> str:
    """The ``ray`` command of this Python, or a skip saying how to get it."""
    pytest.importorskip("ray", reason=RAY_MISSING)
    script = Path(sys.executable).parent / "ray"
    if not script.exists():
        pytest.skip(f"{RAY_MISSING} (no ray command beside {sys.executable})")
    return str(script)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@dataclass(frozen=True)
class Cluster:
    address: str  # 127.0.0.1:PORT, what hydra.launcher.ray.address takes
    temp_dir: Path

    def processes(self) -> list[psutil.Process]:
        """Every process of this cluster: its daemons and all their descendants."""
        found: dict[int, psutil.Process] = {}
        for process in psutil.process_iter(["cmdline"]):
            if str(self.temp_dir) in " ".join(process.info["cmdline"] or ()):
                found[process.pid] = process
                try:
                    found.update((c.pid, c) for c in process.children(recursive=True))
                except psutil.NoSuchProcess:
                    continue
        return list(found.values())


def _start_node(ray: str, args: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(
        [ray, "start", *args], env=env, capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise RuntimeError(f"ray start {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")


@contextmanager
def ray_cluster(
    num_gpus: int = 2, worker_nodes: int = 0, head_gpus: int | None = None
) -> Iterator[Cluster]:
    """A head node (2 CPUs, ``head_gpus`` or ``num_gpus`` declared GPUs) and ``worker_nodes``
    with ``num_gpus`` each, all on 127.0.0.1; every process of it stopped on exit."""
    ray = ray_cli()
    # Short: Ray's Unix socket paths live under it and may not exceed ~107 characters.
    temp_dir = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    port = free_port()
    # Workers inherit the environment of the `ray start` that made their node: the project
    # must be importable there, as it is on a real cluster's nodes.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("MLFLOW_TRACKING_URI", None)
    env.update(RAY_ENV)
    node = ["--node-ip-address=127.0.0.1", "--num-cpus=2"]
    cluster = Cluster(f"127.0.0.1:{port}", temp_dir)
    try:
        head = num_gpus if head_gpus is None else head_gpus
        _start_node(
            ray,
            [
                *("--head", f"--port={port}", f"--temp-dir={temp_dir}", *node),
                *(f"--num-gpus={head}", "--include-dashboard=false", "--disable-usage-stats"),
            ],
            env,
        )
        for _ in range(worker_nodes):
            _start_node(ray, [f"--address={cluster.address}", *node, f"--num-gpus={num_gpus}"], env)
        yield cluster
    finally:
        stop(cluster)
        shutil.rmtree(temp_dir, ignore_errors=True)


def kill_newest_node(cluster: Cluster) -> None:
    """SIGKILL the last node that joined: its raylet and everything under it (its workers,
    their fork servers and jobs), as a machine that loses power would end them."""
    raylets = [p for p in cluster.processes() if p.name() == "raylet"]
    newest = max(raylets, key=lambda p: p.create_time())
    doomed = [*newest.children(recursive=True), newest]
    for process in doomed:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(doomed, timeout=10)


def stop(cluster: Cluster, timeout_s: float = 5.0) -> None:
    """SIGTERM to every process of the cluster, SIGKILL to what outlives it."""
    processes = cluster.processes()
    for process in processes:
        try:
            process.terminate()
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(processes, timeout=timeout_s)
    for process in alive:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(alive, timeout=timeout_s)
