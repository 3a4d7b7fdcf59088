"""What furcate expects of NVML (nvidia-ml-py's ``import pynvml``), held against both NVMLs it
meets: the fake in ``tests/fakes/nvml``, which every GPU test without a GPU runs against, and
the real driver (``gpu``; skipped where NVML lists no GPU). One contract for the two, so that
the fake cannot drift from the driver unseen.

    binding     NVML's codes and compute modes; ``NVMLError(code)`` is the code's subclass
                (nvidia-ml-py's own module needs no GPU for this: it runs everywhere)
    life cycle  every call fails with Uninitialized before ``nvmlInit`` and after the last
                ``nvmlShutdown``; inits are counted                      (in a fresh process)
    devices     count; handle by index and by UUID ("GPU-..."), the UUID round trip; an
                unknown UUID is NotFound, an index past the count InvalidArgument, a UUID's
                prefix (which CUDA takes) refused or the same GPU
    readings    memory total = free + used, total > 0; a compute mode of NVML's; utilisation
                0..100
    processes   a process that holds GPU memory is listed by its own pid with that memory,
                within the GPU's used memory, and is no longer listed once it exited
    no driver   where NVML cannot start, ``nvmlInit`` raises NVMLError (a GPU-less machine)

These are the calls of ``furcate_hydra/execution/gpu/nvml.py``, furcate's one door to NVML; the
behaviour asserted is NVIDIA's NVML API reference's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from furcate_hydra.execution.gpu.devices import NvmlProbe

FAKE_DIR = Path(__file__).resolve().parents[1] / "fakes" / "nvml"
GPUS = NvmlProbe().device_ids()
MIB = 1 << 20
HOLD_MIB = 256
# a well-formed UUID that no GPU has
UNKNOWN_UUID = "GPU-0badcafe-0000-4000-8000-000000000000"
# two fake GPUs as a real machine would list them: a UUID of NVML's form, memory the driver
# keeps for itself, an H100's size, and a GPU in EXCLUSIVE_PROCESS mode
FAKE_GPUS = [
    {"uuid": "GPU-5c8e0f1a-6d2b-4f0e-9a51-3e2d7c1b9a04", "total_mib": 81559, "reserved_mib": 527},
    {
        "uuid": "GPU-9f1e7b3c-2a4d-4c6e-8b0f-1d3c5e7a9b2d",
        "total_mib": 16384,
        "reserved_mib": 255,
        "compute_mode": 3,
    },
]
FAKE_HOLDER = f"""
import os, sys
from pathlib import Path
held = Path(os.environ["FURCATE_FAKE_NVML"]) / "held" / "0"
held.mkdir(parents=True, exist_ok=True)
(held / str(os.getpid())).write_text("{HOLD_MIB}")
print("holding", flush=True)
sys.stdin.read()
"""
REAL_HOLDER = f"""
import sys, torch
held = torch.ones({HOLD_MIB} * 2**18, device="cuda")  # float32: {HOLD_MIB} MiB
torch.cuda.synchronize()
print("holding", flush=True)
sys.stdin.read()
"""
LIFE_CYCLE = """
import json, pynvml
def attempt(call):
    try:
        call()
        return "ok"
    except pynvml.NVMLError as exc:
        return f"{type(exc).__name__} {exc.value}"
steps = {"count before init": attempt(pynvml.nvmlDeviceGetCount)}
steps["handle before init"] = attempt(lambda: pynvml.nvmlDeviceGetHandleByIndex(0))
steps["init"] = attempt(pynvml.nvmlInit)
steps["init again"] = attempt(pynvml.nvmlInit)
steps["shutdown one of two"] = attempt(pynvml.nvmlShutdown)
steps["count with one init left"] = attempt(pynvml.nvmlDeviceGetCount)
steps["last shutdown"] = attempt(pynvml.nvmlShutdown)
steps["count after the last shutdown"] = attempt(pynvml.nvmlDeviceGetCount)
print(json.dumps(steps))
"""
INIT_ONLY = """
import pynvml
try:
    pynvml.nvmlInit()
except pynvml.NVMLError as exc:
    print(type(exc).__name__)
else:
    print("started")
"""


@dataclass(frozen=True)
class Nvml:
    """One implementation: the module this process calls, the environment in which a fresh
    process imports the same one (its GPU 0 being NVML's index 0), and the code of a child
    that holds ``HOLD_MIB`` on GPU 0 until its stdin closes."""

    name: str
    module: Any
    env: dict[str, str]
    holder: str


def load_fake() -> ModuleType:
    """A fresh copy of the fake (its own init count), beside the real ``pynvml`` of this
    process."""
    spec = importlib.util.spec_from_file_location("furcate_fake_pynvml", FAKE_DIR / "pynvml.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def without_fake(env: dict[str, str]) -> dict[str, str]:
    """``env`` where ``import pynvml`` finds nvidia-ml-py's module."""
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p) != FAKE_DIR]
    clean = {k: v for k, v in env.items() if k not in ("FURCATE_FAKE_NVML", "PYTHONPATH")}
    return {**clean, "PYTHONPATH": os.pathsep.join(paths)} if paths else clean


def fake_env(state: Path) -> dict[str, str]:
    path = os.pathsep.join([str(FAKE_DIR), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "FURCATE_FAKE_NVML": str(state)}


def make_fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Nvml:
    state = tmp_path / "nvml"
    state.mkdir()
    (state / "gpus.json").write_text(json.dumps(FAKE_GPUS))
    monkeypatch.setenv("FURCATE_FAKE_NVML", str(state))
    return Nvml("fake", load_fake(), fake_env(state), FAKE_HOLDER)


def make_real() -> Nvml:
    import pynvml

    env = {**without_fake(dict(os.environ)), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    return Nvml("real", pynvml, {**env, "CUDA_VISIBLE_DEVICES": "0"}, REAL_HOLDER)


ON_A_GPU = [pytest.mark.gpu, pytest.mark.skipif(not GPUS, reason="NVML lists no GPU here")]


@pytest.fixture(params=["fake", pytest.param("real", marks=ON_A_GPU)])
def nvml(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Nvml:
    """Each implementation in turn: the fake here, the driver where NVML lists a GPU."""
    return make_fake(tmp_path, monkeypatch) if request.param == "fake" else make_real()


@pytest.fixture
def started(nvml: Nvml) -> Iterator[Any]:
    """The implementation's module between ``nvmlInit`` and ``nvmlShutdown``."""
    nvml.module.nvmlInit()
    try:
        yield nvml.module
    finally:
        nvml.module.nvmlShutdown()


@pytest.fixture(params=["fake", "real"])
def binding(request: pytest.FixtureRequest) -> Any:
    """The module alone, no driver needed: the fake, or nvidia-ml-py's."""
    if request.param == "fake":
        return load_fake()
    import pynvml

    return pynvml


def in_fresh_process(env: dict[str, str], code: str) -> str:
    """The last line ``code`` printed in a new interpreter (which has never called NVML)."""
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def pids_on(pynvml: Any, handle: Any) -> dict[int, int | None]:
    """{pid: usedGpuMemory} of the compute processes on ``handle``."""
    return {p.pid: p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}


def wait_for_line(process: subprocess.Popen[str], expected: str, timeout: float) -> None:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    line = process.stdout.readline() if ready else "(nothing)"
    assert line.strip() == expected, f"the holder printed {line!r} in {timeout} s, not {expected!r}"


@pytest.mark.timeout(30)
def test_the_binding_has_nvmls_codes_and_an_error_class_per_code(binding: Any) -> None:
    modes = ("DEFAULT", "EXCLUSIVE_THREAD", "PROHIBITED", "EXCLUSIVE_PROCESS")
    assert [getattr(binding, f"NVML_COMPUTEMODE_{m}") for m in modes] == [0, 1, 2, 3]
    codes = {"Uninitialized": 1, "InvalidArgument": 2, "NotFound": 6, "LibraryNotFound": 12}
    for name, code in codes.items():
        error = getattr(binding, f"NVMLError_{name}")
        assert issubclass(error, binding.NVMLError)
        # what the module's calls raise, and what furcate's except clauses name
        assert type(binding.NVMLError(code)) is error
        assert error().value == code
        assert str(error())


@pytest.mark.timeout(60)
def test_every_call_fails_before_init_and_after_the_last_shutdown(nvml: Nvml) -> None:
    steps = json.loads(in_fresh_process(nvml.env, LIFE_CYCLE))
    uninitialised = f"NVMLError_Uninitialized {nvml.module.NVML_ERROR_UNINITIALIZED}"
    assert steps == {
        "count before init": uninitialised,
        "handle before init": uninitialised,
        "init": "ok",
        "init again": "ok",
        "shutdown one of two": "ok",
        "count with one init left": "ok",  # inits are counted
        "last shutdown": "ok",
        "count after the last shutdown": uninitialised,
    }


@pytest.mark.timeout(30)
def test_gpus_are_counted_and_found_by_index_and_by_uuid(nvml: Nvml, started: Any) -> None:
    count = started.nvmlDeviceGetCount()
    assert isinstance(count, int) and count >= 1
    uuids = []
    for index in range(count):
        uuid = started.nvmlDeviceGetUUID(started.nvmlDeviceGetHandleByIndex(index))
        assert isinstance(uuid, str) and uuid.startswith("GPU-"), uuid
        assert started.nvmlDeviceGetUUID(started.nvmlDeviceGetHandleByUUID(uuid)) == uuid
        uuids.append(uuid)
    assert len(set(uuids)) == count
    with pytest.raises(started.NVMLError_InvalidArgument):
        started.nvmlDeviceGetHandleByIndex(count)


@pytest.mark.timeout(30)
def test_an_unknown_uuid_is_not_found_and_a_prefix_is_never_another_gpu(
    nvml: Nvml, started: Any
) -> None:
    with pytest.raises(started.NVMLError_NotFound) as raised:
        started.nvmlDeviceGetHandleByUUID(UNKNOWN_UUID)
    assert raised.value.value == started.NVML_ERROR_NOT_FOUND
    uuid = started.nvmlDeviceGetUUID(started.nvmlDeviceGetHandleByIndex(0))
    # furcate's Nvml.handle takes either refusal as "look the prefix up among the UUIDs"
    try:
        handle = started.nvmlDeviceGetHandleByUUID(uuid[:12])
    except (started.NVMLError_NotFound, started.NVMLError_InvalidArgument):
        return
    assert started.nvmlDeviceGetUUID(handle) == uuid


@pytest.mark.timeout(30)
def test_memory_adds_up_and_mode_and_utilisation_are_nvmls(nvml: Nvml, started: Any) -> None:
    modes = {
        started.NVML_COMPUTEMODE_DEFAULT,
        started.NVML_COMPUTEMODE_EXCLUSIVE_THREAD,
        started.NVML_COMPUTEMODE_PROHIBITED,
        started.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
    }
    for index in range(started.nvmlDeviceGetCount()):
        handle = started.nvmlDeviceGetHandleByIndex(index)
        memory = started.nvmlDeviceGetMemoryInfo(handle)
        assert memory.total > 0
        assert abs(memory.total - memory.free - memory.used) <= MIB, (index, memory)
        assert started.nvmlDeviceGetComputeMode(handle) in modes
        rates = started.nvmlDeviceGetUtilizationRates(handle)
        assert 0 <= rates.gpu <= 100 and 0 <= rates.memory <= 100, (rates.gpu, rates.memory)


@pytest.mark.timeout(120)
def test_a_process_holding_memory_is_listed_by_its_pid_until_it_exits(
    nvml: Nvml, started: Any
) -> None:
    handle = started.nvmlDeviceGetHandleByIndex(0)
    holder = subprocess.Popen(
        [sys.executable, "-c", nvml.holder],
        env=nvml.env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_line(holder, "holding", 90)  # the real one imports torch, makes a context
        listed = pids_on(started, handle)
        used = started.nvmlDeviceGetMemoryInfo(handle).used
        assert holder.pid in listed, (
            f"NVML listed pids {sorted(listed)}, not the holder's {holder.pid}: a pid namespace "
            "between them (NVML then names the host's pids)?"
        )
        held = listed[holder.pid]
        assert held is not None and held >= HOLD_MIB * MIB, held
        assert used >= sum(memory or 0 for memory in listed.values())
        assert holder.stdin is not None
        holder.stdin.close()  # it returns from its read and exits; not reaped yet: a zombie
        deadline = time.monotonic() + 15
        while holder.pid in pids_on(started, handle):
            assert time.monotonic() < deadline, "NVML still lists the holder 15 s after its end"
            time.sleep(0.2)
        assert holder.wait(30) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("which", ["fake", "real"])
def test_where_nvml_cannot_start_init_raises_an_nvml_error(which: str, tmp_path: Path) -> None:
    if which == "fake":
        env = fake_env(tmp_path)  # a state dir without gpus.json: no driver
    elif GPUS:
        pytest.skip("NVML starts on this machine")
    else:
        env = without_fake(dict(os.environ))
    assert in_fresh_process(env, INIT_ONLY).startswith("NVMLError_")
