"""NVIDIA's MPS daemon for a sweep whose GPUs run several jobs at once (``hydra.launcher.mps``).

    start_mps(mode, devices, shared, sweep_dir)
      ├─ off, or auto where each GPU runs one job at a time ....... None, nothing said
      ├─ a daemon answers at $CUDA_MPS_PIPE_DIRECTORY, or at /tmp/nvidia-mps where that is
      │  unset ..................................... MpsDaemon(owned=False): used, never stopped
      ├─ no nvidia-cuda-mps-control on PATH, a GPU whose compute mode forbids MPS, or (auto)
      │  NVML cannot tell ............ auto: None and one line why; on: FurcateConfigError
      └─ python -m furcate_hydra.execution.gpu.mps_watch ─ nvidia-cuda-mps-control -f
         (own session; CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY, CUDA_VISIBLE_DEVICES
         = the sweep's GPUs, CUDA_DEVICE_ORDER=PCI_BUS_ID) ........ MpsDaemon(owned=True)
         └─ it does not answer within START_TIMEOUT_S[mode] (auto 5 s, on 30 s): killed;
            auto: None and one line why; on: FurcateConfigError
    MpsDaemon.stop() / Ctrl-C / a crash / kill -9 of the launcher: the watchdog's stdin closes,
    it sends the daemon ``quit`` and SIGKILLs it after a grace period (see ``mps_watch``).

What this module takes from NVIDIA's MPS docs (the "Multi-Process Service" guide at
docs.nvidia.com/deploy/mps: its tools reference and its environment-variable and logging
appendices; and the ``nvidia-cuda-mps-control`` man page):

- ``nvidia-cuda-mps-control -f`` runs the control daemon in the foreground; ``quit`` written to
  ``nvidia-cuda-mps-control``'s stdin, with the same ``CUDA_MPS_PIPE_DIRECTORY``, shuts it and
  its servers down. A CUDA process connects to the daemon of the pipe dir in its environment
  (``/tmp/nvidia-mps`` by default) and runs without MPS where none answers there.
- The pipe dir holds the daemon's unix sockets; ``control`` is the one clients connect to
  (as in the default install, ``/tmp/nvidia-mps/control``). A socket path has at most 107
  bytes (``sun_path``), and room is left for the names MPS gives its other sockets. Whether a
  daemon answers there is asked as ``mps_watch.daemon_answers`` says (its socket's type was
  measured on an H200, not documented).
- ``CUDA_MPS_LOG_DIRECTORY`` holds ``control.log`` and the servers' ``server.log``.
- ``CUDA_VISIBLE_DEVICES`` in the daemon's environment remaps the GPUs: a job then names the
  k-th GPU of that list as index k, or by UUID (``MpsDaemon.visible_device``).
- The compute modes DEFAULT and EXCLUSIVE_PROCESS allow MPS (exclusive mode applies to the MPS
  server, not to its clients); PROHIBITED allows no CUDA context; EXCLUSIVE_THREAD is not taken.
- What a fault does to the jobs sharing a GPU: ``mps_log.MPS_FAULT_BEHAVIOUR``.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.execution.gpu import mps_watch
from furcate_hydra.execution.gpu.mps_daemon import LOG_ENV, PIPE_ENV, MpsDaemon, start_daemon
from furcate_hydra.execution.gpu.mps_log import MPS_FAULT_BEHAVIOUR, MpsFaultScan
from furcate_hydra.execution.gpu.nvml import NvmlUnavailable, nvml_started
from furcate_hydra.layout import SweepPaths

__all__ = [
    "BINARY",
    "DEFAULT_PIPE_DIR",
    "KEY",
    "MPS_FAULT_BEHAVIOUR",
    "MPS_MODES",
    "START_TIMEOUT_S",
    "ComputeModes",
    "MpsDaemon",
    "MpsFaultScan",
    "check_mps_mode",
    "nvml_compute_modes",
    "start_mps",
]

log = logging.getLogger(__name__)

MPS_MODES = ("auto", "on", "off")
# How long the daemon furcate starts may take to answer. The real one answered at once on an
# H200: auto gives up soon, as the sweep runs without MPS anyway; on waits longer for a slow
# machine, the sweep cannot run without it.
START_TIMEOUT_S = {"auto": 5.0, "on": 30.0}
KEY = "hydra.launcher.mps"
BINARY = "nvidia-cuda-mps-control"
DEFAULT_PIPE_DIR = Path("/tmp/nvidia-mps")
ALLOWED_COMPUTE_MODES = ("DEFAULT", "EXCLUSIVE_PROCESS")
# device ids -> each one's compute mode ("DEFAULT", "PROHIBITED", ...), None where NVML is silent
ComputeModes = Callable[[Sequence[str]], dict[str, str | None]]

_TIME_SLICE = "jobs sharing a GPU time-slice it"


def check_mps_mode(value: object) -> str:
    """``value`` as one of MPS_MODES.

    YAML reads a bare ``on``/``off`` as a boolean, which a ``str`` field then holds as
    "True"/"False": those are taken as on and off.

    Raises:
        FurcateConfigError: for anything else, naming hydra.launcher.mps and the three modes.
    """
    if isinstance(value, bool) or value in ("True", "False"):
        return "on" if value in (True, "True") else "off"
    if isinstance(value, str) and value.strip().lower() in MPS_MODES:
        return value.strip().lower()
    raise FurcateConfigError(
        KEY,
        value,
        f"must be one of {', '.join(MPS_MODES)}",
        f"set {KEY}=auto (start an MPS daemon where GPUs run several jobs and it can run), "
        f"on (always; an error where it cannot) or off (never)",
    )


def nvml_compute_modes(devices: Sequence[str]) -> dict[str, str | None]:
    """Each device's compute mode as NVML names it, None where NVML cannot tell."""
    try:
        with nvml_started() as nvml:
            modes: dict[str, str | None] = {}
            for device in devices:
                try:
                    modes[device] = nvml.compute_mode(nvml.handle(device))
                except RuntimeError:  # NvmlError, or no GPU of that UUID prefix
                    modes[device] = None
            return modes
    except NvmlUnavailable:
        return dict.fromkeys(devices)


def start_mps(
    mode: str,
    devices: Sequence[str],
    shared: bool,
    sweep_dir: Path,
    *,
    environ: Mapping[str, str] | None = None,
    compute_modes: ComputeModes | None = None,
    timeout_s: float | None = None,
    grace_s: float = 10.0,
    say: Callable[[str], None] | None = None,
) -> MpsDaemon | None:
    """The MPS daemon a sweep's GPU jobs use, started where ``mode`` asks and it can run.

    Args:
        mode: One of MPS_MODES (checked with ``check_mps_mode``).
        devices: The sweep's GPU ids ("0", "GPU-<uuid>"), as slots name them.
        shared: Whether a GPU may run more than one job at a time.
        sweep_dir: The sweep's dir: the daemon's pipe and log dirs go in it (SweepPaths).
        environ: The launcher's environment (``os.environ`` if None): PATH to find the
            binary, a user's CUDA_MPS_PIPE_DIRECTORY.
        compute_modes: Reads each GPU's compute mode (``nvml_compute_modes`` if None).
        timeout_s: How long the daemon may take until it answers (START_TIMEOUT_S[mode]
            if None).
        grace_s: How long ``quit`` may take at the end before the daemon is killed.
        say: Where the one line saying what was done goes (``log.info`` if None).

    Returns:
        The daemon, or None where the sweep runs without one (off; auto where not shared or
        where MPS cannot run, which ``say`` is told).

    Raises:
        FurcateConfigError: ``mode`` is not a mode, or it is on and MPS cannot run: the
            problem says why, the fix what to install or set.
    """
    mode = check_mps_mode(mode)
    env = dict(os.environ if environ is None else environ)
    tell = say or log.info
    if mode == "off" or (mode == "auto" and not (shared and devices)):
        return None
    timeout_s = START_TIMEOUT_S[mode] if timeout_s is None else timeout_s
    user = _user_daemon(env)
    if user is not None:
        tell(user.line)
        return user
    why, fix = _cannot_start(devices, env, compute_modes or nvml_compute_modes, mode)
    if why is None:
        binary = str(shutil.which(BINARY, path=env.get("PATH")))
        daemon, why = start_daemon(binary, devices, sweep_dir, env, timeout_s, grace_s)
        if daemon is not None:
            tell(daemon.line)
            return daemon
        fix = f"see the daemon's logs in {SweepPaths.of(sweep_dir).mps_log_dir}"
    if mode == "on":
        raise FurcateConfigError(
            KEY, mode, f"MPS cannot run here: {why}", f"{fix}, or set {KEY}=auto or off"
        )
    tell(f"furcate: MPS off: {why}; {_TIME_SLICE}")
    return None


def _user_daemon(env: Mapping[str, str]) -> MpsDaemon | None:
    """The daemon a CUDA job of this environment would reach already, if one answers: to
    NVIDIA's client where it is on PATH, else to a connect to its control socket."""
    named = env.get(PIPE_ENV)
    pipe_dir = Path(named) if named else DEFAULT_PIPE_DIR
    if not mps_watch.daemon_answers(pipe_dir, shutil.which(BINARY, path=env.get("PATH")), env):
        return None
    line = (
        f"furcate: MPS: using the daemon already running (pipe dir {pipe_dir}); "
        "furcate leaves it as it is"
    )
    log_dir = Path(env.get(LOG_ENV) or "/var/log/nvidia-mps")
    return MpsDaemon(line, pipe_dir, log_dir, env={PIPE_ENV: named} if named else {})


def _cannot_start(
    devices: Sequence[str], env: Mapping[str, str], read_modes: ComputeModes, mode: str
) -> tuple[str | None, str]:
    """Why furcate cannot start a daemon here and what fixes it, or (None, "")."""
    if not devices:
        return "the sweep runs on no GPU", "give the sweep GPUs (hydra.launcher.gpus)"
    if shutil.which(BINARY, path=env.get("PATH")) is None:
        return (
            f"{BINARY} is not on PATH",
            f"install the CUDA MPS binary {BINARY} (it comes with the NVIDIA driver's compute "
            "utilities) and put it on PATH",
        )
    modes = read_modes(devices)
    for device in devices:
        found = modes.get(device)
        if found is None and mode == "auto":
            return (
                f"NVML cannot tell the compute mode of GPU {device}",
                "check the NVIDIA driver with nvidia-smi",
            )
        if found is not None and found not in ALLOWED_COMPUTE_MODES:
            return (
                f"GPU {device} is in compute mode {found}, which allows no MPS daemon",
                f"set its compute mode to DEFAULT (nvidia-smi -i {device} -c DEFAULT, as root)",
            )
    return None, ""
