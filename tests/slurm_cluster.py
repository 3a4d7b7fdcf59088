"""A real single-node Slurm, and a real PostgreSQL, for tests: started here, stopped by pid.

Each cluster has its own temp dir (config, state, spool, logs), its own free ports, its own
munge daemon and socket, and four fake GPUs: character devices made with ``mknod`` (Slurm's
GRES gives a job ``CUDA_VISIBLE_DEVICES`` only for devices, not plain files), declared as
``gpu:4`` of one node with 8 CPUs. Nothing is stopped by name: the daemons by the pids they
were started with, running jobs by ``scancel`` first (a job's processes outlive slurmd).

Needs root (slurmd runs jobs as their user, munged as ``munge``) and Debian's ``slurm-wlm``,
``munge`` and ``postgresql``; without them the tests that use it are skipped, saying why.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bench.postgres import Cluster, free_port, pg_bin

SLURM_BINARIES = ("slurmctld", "slurmd", "munged", "sbatch", "squeue", "scontrol", "scancel")
GPUS = 4
CPUS = 8
START_TIMEOUT_S = 30.0
# Slurm's scheduler reacts at once (the defaults wait seconds); a requeued job runs again
# seconds later (cred_expire: how long its old credential blocks it).
_SCHEDULER = "batch_sched_delay=0,bf_interval=1,sched_interval=5"


def _which(binary: str) -> str | None:
    return shutil.which(binary) or shutil.which(binary, path="/usr/sbin:/sbin")


def require_slurm() -> None:
    """Skip, saying why, unless this machine can run a test cluster."""
    missing = [b for b in SLURM_BINARIES if _which(b) is None]
    if missing:
        pytest.skip(
            f"Slurm is not installed ({', '.join(missing)} missing): "
            "apt-get install slurm-wlm munge to run the Slurm tests"
        )
    if os.geteuid() != 0:
        pytest.skip("the Slurm test cluster runs slurmd and munged, which needs root")
    if not Path("/etc/munge/munge.key").exists():
        pytest.skip("munge has no key (/etc/munge/munge.key): reinstall munge")


@dataclass
class SlurmCluster:
    """A running test cluster; ``env`` is what a command needs to talk to it."""

    root: Path
    node: str
    env: dict[str, str]
    pids: dict[str, int] = field(default_factory=dict)

    def run(self, *command: str, check: bool = True) -> str:
        # in the cluster's dir: a job without --output writes its slurm-<id>.out there
        done = subprocess.run(
            command,
            env=self.env,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(command)} failed: {done.stdout}{done.stderr}")
        return done.stdout

    def sbatch(self, *args: str) -> str:
        """Submit; the job id (``--parsable``: ``12`` or ``12;cluster``)."""
        return self.run("sbatch", "--parsable", *args).strip().split(";")[0]

    def job_state(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields of one job (an array: its first task's)."""
        text = self.run("scontrol", "show", "job", "-o", job_id, check=False)
        line = text.splitlines()[0] if text.strip() else ""
        return dict(part.split("=", 1) for part in line.split() if "=" in part)

    def queue(self) -> list[str]:
        return [line for line in self.run("squeue", "-h", "-o", "%i %T").splitlines() if line]

    def wait_idle(self, timeout_s: float) -> None:
        """Until no job is queued or running."""
        wait_until(
            lambda: not self.queue(),
            "an empty queue",
            timeout_s,
            detail=lambda: f"jobs still in the queue: {self.queue()}",
        )

    def log(self, name: str) -> str:
        path = self.root / "log" / name
        return path.read_text(errors="replace") if path.exists() else ""


def _config(root: Path, host: str, node: str, ctld_port: int, slurmd_port: int) -> str:
    return f"""\
ClusterName=furcatetest
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.socket.2,cred_expire=5
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
SchedulerType=sched/backfill
SchedulerParameters={_SCHEDULER}
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
OverTimeLimit=0
MinJobAge=300
InactiveLimit=0
GresTypes=gpu
NodeName={node} NodeAddr=127.0.0.1 CPUs={CPUS} Boards=1 SocketsPerBoard=1 \
CoresPerSocket={CPUS} ThreadsPerCore=1 RealMemory=4000 Gres=gpu:{GPUS} State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


def _start(command: list[str], out: Path, env: dict[str, str]) -> int:
    with out.open("wb") as sink:
        process = subprocess.Popen(
            command,
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    return process.pid


def _stop_pid(pid: int, timeout_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it outlives ``timeout_s``; reaped if it is our child."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:  # not ours (munged forks itself): poll its existence
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


@contextmanager
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A single-node cluster with four fake GPUs, up until the block ends."""
    require_slurm()
    # not pytest's tmp_path: its parents are 0700, and munged (user munge) must reach its
    # socket; a short path, since a unix socket's path has at most 107 bytes
    root = Path(tempfile.mkdtemp(prefix="furcate-slurm-"))
    root.chmod(0o755)
    # a node named unlike this machine, as on a real cluster (slurmd -N says which it is):
    # what runs there must not take this machine's disk for the node's
    host, node = socket.gethostname().split(".")[0], "furcate-node0"
    for sub in ("state", "spool", "log", "munge", "dev"):
        (root / sub).mkdir()
    shutil.chown(root / "munge", "munge", "munge")
    (root / "munge").chmod(0o755)
    for i in range(GPUS):
        os.mknod(root / "dev" / f"nvidia{i}", 0o666 | 0o020000, os.makedev(195, i))
    conf = root / "slurm.conf"
    conf.write_text(_config(root, host, node, free_port(), free_port()))
    (root / "gres.conf").write_text(
        f"AutoDetect=off\nNodeName={node} Name=gpu File={root}/dev/nvidia[0-{GPUS - 1}]\n"
    )
    env = {**os.environ, "SLURM_CONF": str(conf)}
    for name in list(env):  # a test run inside a Slurm job must not talk to that job
        if name.startswith("SLURM_") and name != "SLURM_CONF":
            del env[name]
    cluster = SlurmCluster(root, node, env)
    try:
        munge = root / "munge"
        subprocess.run(
            [
                "runuser", "-u", "munge", "--", _which("munged") or "munged",
                f"--socket={munge}/munge.socket.2", f"--pid-file={munge}/munged.pid",
                f"--log-file={munge}/munged.log", f"--seed-file={munge}/munged.seed",
            ],
            check=True, timeout=30, capture_output=True,
        )  # fmt: skip
        cluster.pids["munged"] = int((munge / "munged.pid").read_text())
        for daemon, more in (("slurmctld", []), ("slurmd", ["-N", node])):
            command = [_which(daemon) or daemon, "-D", "-f", str(conf), *more]
            cluster.pids[daemon] = _start(command, root / "log" / f"{daemon}.out", env)
        wait_until(
            lambda: cluster.run("sinfo", "-h", "-N", "-o", "%T", check=False).strip() == "idle",
            "the test cluster's node to become idle",
            START_TIMEOUT_S,
            every_s=0.1,
            detail=lambda: cluster.log("slurmctld.log")[-3000:] + cluster.log("slurmd.log")[-3000:],
        )
        yield cluster
    finally:
        _stop_cluster(cluster)


def _stop_cluster(cluster: SlurmCluster) -> None:
    if "slurmctld" in cluster.pids:
        cluster.run("scancel", "--full", "--user", "root", check=False)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and cluster.run("squeue", "-h", check=False).strip():
            time.sleep(0.2)
    for daemon in ("slurmd", "slurmctld", "munged"):
        if daemon in cluster.pids:
            _stop_pid(cluster.pids[daemon])
    shutil.rmtree(cluster.root, ignore_errors=True)


# -- PostgreSQL ----------------------------------------------------------------------------


@contextmanager
def postgres_server() -> Iterator[Cluster]:
    """The bench's PostgreSQL cluster (``bench/postgres.py``) in a temp dir of its own, started
    on 127.0.0.1 and a free port (trust authentication: loopback and throwaway databases),
    ``pg_ctl stop`` at the end; ``create_database(name)`` gives a database's URL."""
    if pg_bin() is None:
        pytest.skip("PostgreSQL is not installed (no pg_ctl): apt-get install postgresql")
    if os.geteuid() != 0:
        pytest.skip("the PostgreSQL test server is started as the postgres user, which needs root")
    root = Path(tempfile.mkdtemp(prefix="furcate-pg-"))
    try:
        with Cluster(root / "pg", max_connections="200").running() as cluster:
            yield cluster
    finally:
        shutil.rmtree(root, ignore_errors=True)


def job_script(path: Path, *command: str, setup: tuple[str, ...] = ()) -> Path:
    """A user's job.sh: ``exec`` the sweep, so that the launcher is the batch shell and gets
    ``--signal=B:USR1@<s>`` itself (bash would die of it, leaving the launcher to SIGKILL)."""
    quoted = " ".join(shlex.quote(part) for part in command)
    path.write_text("#!/bin/bash\n" + "".join(f"{line}\n" for line in setup) + f"exec {quoted}\n")
    path.chmod(0o755)
    return path


def sweep_script(tmp_path: Path, app: Path, tracking_uri: str, *overrides: str) -> Path:
    """tmp_path/job.sh: ``exec python <app> -m <overrides>``, plain progress lines, recording
    into ``tracking_uri`` (the script exports it: sbatch passes on the environment of the
    submitter, which is the cluster's, made when the cluster started)."""
    return job_script(
        tmp_path / "job.sh",
        sys.executable,
        str(app),
        "-m",
        *overrides,
        "hydra.launcher.progress=plain",
        setup=(f"export MLFLOW_TRACKING_URI={tracking_uri}",),
    )


# each array task's launcher writes its own sweep dir (Hydra resolves the variable)
ARRAY_SWEEP_DIR = "multirun/${oc.env:SLURM_ARRAY_TASK_ID}"


def run_array(cluster: SlurmCluster, tmp_path: Path, script: Path, tasks: int) -> str:
    """``sbatch --array=0-<tasks-1> --gres=gpu:1 --cpus-per-task=1 script`` in tmp_path (its
    tasks' output in slurm-<job>_<task>.out there), until no task is left; the job id."""
    job = cluster.sbatch(
        f"--array=0-{tasks - 1}",
        "--gres=gpu:1",
        "--cpus-per-task=1",
        f"--output={tmp_path}/slurm-%A_%a.out",
        f"--chdir={tmp_path}",
        str(script),
    )
    wait_until(lambda: not any(line.startswith(job) for line in cluster.queue()), "the array", 280)
    return job


def wait_until(
    condition: Callable[[], bool],
    what: str,
    timeout_s: float,
    every_s: float = 0.5,
    detail: Callable[[], str] | None = None,
) -> None:
    """Poll ``condition`` every ``every_s`` until it holds; past ``timeout_s`` fail, saying
    ``what`` was awaited and ``detail()`` (what the cluster shows then)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            message = f"timed out after {timeout_s:g} s waiting for {what}"
            raise AssertionError(message + (f":\n{detail()}" if detail is not None else ""))
        time.sleep(every_s)
