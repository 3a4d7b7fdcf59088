"""A real Ray cluster on loopback for tests: ``ray start`` nodes, stopped by their own pids.

``ray stop`` would stop every Ray process of the machine (other sweeps' too), so each cluster
has its own temp dir, and teardown stops exactly the processes whose command line names it,
with their descendants (the workers, the slot actors and their fork servers).

Loopback only: the nodes start through ``tests/ray_loopback.py`` and drivers run with
``RAY_ENV`` (see there why), and ``loopback_only`` checks every socket of the cluster and of
the launcher while a sweep runs.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from furcate_hydra.ray_backend.cluster import USAGE_STATS_VAR
from tests.conftest import REPO
from tests.test_store_server import free_port

# Loopback-only test clusters: no token (Ray 2.60 makes one per machine by default, in ~).
_NODE_ENV = {"RAY_AUTH_MODE": "disabled"}
# What a driver of the tests (the launcher under test, through the environment of its CLI
# run) gets: with Ray's switch for single-machine Ray, ray.init keeps 127.0.0.1:PORT as given
# (else it connects to the machine's own address instead), and a Ray instance it starts
# itself is on loopback. `ray start --address` refuses to add a node under that switch: the
# nodes get the same through tests/ray_loopback.py instead.
RAY_ENV = {**_NODE_ENV, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
LOOPBACK_START = Path(__file__).with_name("ray_loopback.py")
RAY_MISSING = "Ray is not installed: pip install 'furcate-hydra[ray]' to run the Ray tests"


def ray_cli() -> str:
    """The ``ray`` command of this Python, or a skip saying how to get it."""
    pytest.importorskip("ray", reason=RAY_MISSING)
    script = Path(sys.executable).parent / "ray"
    if not script.exists():
        pytest.skip(f"{RAY_MISSING} (no ray command beside {sys.executable})")
    return str(script)


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


def _start_node(args: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, str(LOOPBACK_START), "start", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"ray start {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")


@contextmanager
def ray_cluster(
    num_gpus: int = 2, worker_nodes: int = 0, head_gpus: int | None = None
) -> Iterator[Cluster]:
    """A head node (2 CPUs, ``head_gpus`` or ``num_gpus`` declared GPUs) and ``worker_nodes``
    with ``num_gpus`` each, all on 127.0.0.1; every process of it stopped on exit."""
    ray_cli()
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
    # a driver's switch (RAY_ENV) in this process, a benchmark's say: `ray start --address`
    # refuses it, and the nodes keep loopback through tests/ray_loopback.py instead
    env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
    env.update(_NODE_ENV)
    node = ["--node-ip-address=127.0.0.1", "--num-cpus=2"]
    cluster = Cluster(f"127.0.0.1:{port}", temp_dir)
    try:
        head = num_gpus if head_gpus is None else head_gpus
        _start_node(
            [
                *("--head", f"--port={port}", f"--temp-dir={temp_dir}", *node),
                *(f"--num-gpus={head}", "--include-dashboard=false", "--disable-usage-stats"),
            ],
            env,
        )
        for _ in range(worker_nodes):
            _start_node([f"--address={cluster.address}", *node, f"--num-gpus={num_gpus}"], env)
        addresses = node_addresses(cluster)
        if addresses != ["127.0.0.1"] * (1 + worker_nodes):
            raise RuntimeError(f"the nodes registered as {addresses}, not all as 127.0.0.1")
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


_NODES = """
import json, sys, ray
ray.init(address=sys.argv[1], log_to_driver=False)
print(json.dumps([n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]]))
"""


def node_addresses(cluster: Cluster) -> list[str]:
    """The address each live node of the cluster registered with (``ray.nodes()``), as a
    driver of the tests sees them."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    done = subprocess.run(
        [sys.executable, "-c", _NODES, cluster.address],
        env={**env, **RAY_ENV},
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"ray.nodes() at {cluster.address} failed:\n{done.stderr}")
    addresses: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return addresses


def is_loopback(host: str) -> bool:
    """127.0.0.0/8 or ::1, also as an IPv4-mapped IPv6 address (``::ffff:127.0.0.1``)."""
    address = ipaddress.ip_address(host.split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


@dataclass
class Sockets:
    """What ``loopback_only`` saw: each TCP/UDP socket as ``who status local -> remote``
    (``who`` is ``launcher``, or the process's name), and those with an address off
    loopback (a listen on every interface, ``0.0.0.0`` or ``::``, is off loopback too)."""

    seen: set[str] = field(default_factory=set)
    off_loopback: set[str] = field(default_factory=set)
    gcs_ports: set[int] = field(default_factory=set)  # where a gcs_server listened
    launcher_peers: set[int] = field(default_factory=set)  # ports the launcher connected to
    # RAY_USAGE_STATS_ENABLED in each gcs_server's environment ("unset" where it had none)
    usage_stats: set[str] = field(default_factory=set)

    def sample(self, processes: list[psutil.Process], launcher: str) -> None:
        for process in processes:
            try:
                name = process.name()
                who = "launcher" if launcher in process.cmdline() else name
                connections = process.net_connections(kind="inet")
                environ = process.environ() if name == "gcs_server" else None
                if environ:  # a process that has exited (a zombie) shows an empty environment
                    self.usage_stats.add(environ.get(USAGE_STATS_VAR, "unset"))
            except psutil.Error:
                continue
            for conn in connections:
                local = f"{conn.laddr.ip}:{conn.laddr.port}" if conn.laddr else "-"
                remote = f"{conn.raddr.ip}:{conn.raddr.port}" if conn.raddr else "-"
                line = f"{who} ({process.pid}) {conn.status} {local} -> {remote}"
                self.seen.add(line)
                if any(a and not is_loopback(a.ip) for a in (conn.laddr, conn.raddr)):
                    self.off_loopback.add(line)
                if name == "gcs_server" and conn.status == psutil.CONN_LISTEN:
                    self.gcs_ports.add(conn.laddr.port)
                if who == "launcher" and conn.raddr:
                    self.launcher_peers.add(conn.raddr.port)


@contextmanager
def loopback_only(
    cluster: Cluster | None, launcher: Path, interval_s: float = 0.5
) -> Iterator[Sockets]:
    """While the block runs (a sweep), every ``interval_s`` the sockets of the cluster's
    processes and of this test's child processes (the launcher running the ``launcher``
    script, a Ray instance it starts itself, the mlflow server); then asserts that each had
    only loopback addresses, and that the launcher was seen connected to a GCS (else the
    check saw nothing that proves it)."""
    sockets = Sockets()
    done = threading.Event()
    failed: list[BaseException] = []

    def watch() -> None:
        try:
            while not done.is_set():
                found = {p.pid: p for p in psutil.Process().children(recursive=True)}
                if cluster is not None:
                    found.update((p.pid, p) for p in cluster.processes())
                sockets.sample(list(found.values()), str(launcher))
                done.wait(interval_s)
        except BaseException as exc:  # raised again below, in the test
            failed.append(exc)

    watcher = threading.Thread(target=watch, name="loopback-only", daemon=True)
    watcher.start()
    try:
        yield sockets
    finally:
        done.set()
        watcher.join()
    if failed:
        raise failed[0]
    off, seen = ("\n".join(sorted(lines)) for lines in (sockets.off_loopback, sockets.seen))
    assert not sockets.off_loopback, f"sockets off loopback:\n{off}"
    assert sockets.gcs_ports & sockets.launcher_peers, (
        f"the launcher was not seen connected to a Ray GCS; seen:\n{seen}"
    )
