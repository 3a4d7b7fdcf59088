"""The resource tracer on real process trees: memory held by a job's descendants reaches its
trace; its samples, file, plot and peaks; GPU figures from a fake NVML (no GPU here) and from
the real one under the ``gpu`` mark."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import types
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from furcate_hydra.execution.gpu.devices import NvmlProbe
from furcate_hydra.layout import JobPaths
from furcate_hydra.tracing import ResourceTracer, TracePeaks, TraceSample
from furcate_hydra.tracing.gpu import GpuUsage, NvmlSampler
from furcate_hydra.tracing.process_tree import MIB, descendants, tree_usage
from furcate_hydra.tracing.samples import append_sample, read_trace

# a parent that starts a child holding argv[1] MiB for argv[2] seconds, as a job's DataLoader
# worker would; the child says so once it holds the memory
HOLDER = (
    "import subprocess, sys, time\n"
    "if sys.argv[3] == 'parent':\n"
    "    child = subprocess.Popen([sys.executable, __file__, *sys.argv[1:3], 'child'])\n"
    "    child.wait()\n"
    "else:\n"
    "    held = b'\\x01' * (int(sys.argv[1]) << 20)\n"
    "    print('holding', flush=True)\n"
    "    time.sleep(float(sys.argv[2]))\n"
)


@pytest.fixture
def holder_script(tmp_path: Path) -> Path:
    path = tmp_path / "holder.py"
    path.write_text(HOLDER)
    return path


def start_tree(script: Path, mb: int, seconds: float) -> subprocess.Popen[str]:
    """A parent whose child holds ``mb`` MiB for ``seconds``; returns once it holds it."""
    root = subprocess.Popen(
        [sys.executable, str(script), str(mb), str(seconds), "parent"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert root.stdout is not None and root.stdout.readline() == "holding\n"
    return root


class Sink:
    """Records what the tracer sends into a run."""

    def __init__(self) -> None:
        self.metrics: list[tuple[str, int, float, Mapping[str, float]]] = []
        self.files: list[tuple[str, Path, str | None]] = []

    def log_metrics(
        self, run_id: str, rows: Sequence[tuple[int, float, Mapping[str, float]]]
    ) -> None:
        self.metrics += [(run_id, *row) for row in rows]

    def log_files(self, run_id: str, files: Sequence[tuple[Path, str | None]]) -> None:
        self.files += [(run_id, path, folder) for path, folder in files]


def test_a_tree_counts_the_memory_its_descendants_hold(holder_script: Path) -> None:
    root = start_tree(holder_script, 120, 30)
    try:
        (child,) = descendants(root.pid)
        usage = tree_usage(root.pid)
        assert usage is not None and usage.pids == (root.pid, child)
        assert usage.rss_bytes >= 120 * MIB
        alone = tree_usage(child)
        assert alone is not None and alone.rss_bytes < usage.rss_bytes
    finally:
        root.kill()
        root.wait()
    assert tree_usage(root.pid) is None  # gone (reaped): nothing to sample


def test_the_trace_of_a_job_holding_memory_reaches_it(tmp_path: Path, holder_script: Path) -> None:
    sink = Sink()
    tracer = ResourceTracer(0.2, sink, flush_every_s=0.5)
    paths = JobPaths.of(tmp_path / "job")
    root = start_tree(holder_script, 150, 1.5)
    tracer.start(
        "1", root.pid, time.time(), device=None, paths=paths, run_id="run-1", title="job #1"
    )
    root.wait()
    time.sleep(0.3)  # the tracer finds the tree gone: no sample of a dead job
    peaks = tracer.end("1")
    tracer.close()

    assert peaks is not None and peaks.rss_mb is not None and peaks.rss_mb >= 150
    assert (peaks.gpu_mem_mb, peaks.gpu_util_percent) == (None, None)  # a CPU slot
    samples = read_trace(paths.trace)
    assert len(samples) == peaks.samples >= 4
    assert max(s.rss_mb for s in samples) == pytest.approx(peaks.rss_mb, abs=0.01)
    elapsed = [s.elapsed_s for s in samples]
    assert elapsed == sorted(elapsed) and elapsed[0] == pytest.approx(0.2, abs=0.15)
    # every sample went into the run, steps 1..n, in batches (flush_every_s), none twice
    assert [step for _, step, _, _ in sink.metrics] == list(range(1, len(samples) + 1))
    assert {name for *_, values in sink.metrics for name in values} == {
        "job/rss_mb",
        "job/cpu_percent",
    }
    assert paths.trace_plot.stat().st_size > 0
    assert [(path.name, folder) for _, path, folder in sink.files] == [
        ("trace.csv", None),
        ("resource_trace.png", "plots"),
    ]


def test_a_job_shorter_than_the_interval_has_no_trace(tmp_path: Path) -> None:
    sink = Sink()
    tracer = ResourceTracer(5.0, sink)
    paths = JobPaths.of(tmp_path / "job")
    job = subprocess.Popen([sys.executable, "-c", "pass"])
    tracer.start("1", job.pid, time.time(), device=None, paths=paths, run_id="r", title="j")
    job.wait()
    assert tracer.end("1") is None
    tracer.close()
    assert not paths.output_dir.exists() and not sink.metrics and not sink.files


def test_a_retried_job_continues_its_trace(tmp_path: Path, holder_script: Path) -> None:
    tracer = ResourceTracer(0.2, None)
    paths = JobPaths.of(tmp_path / "job")
    first_start = time.time()
    for attempt in range(2):
        root = start_tree(holder_script, 10, 0.7)
        started = first_start if attempt == 0 else time.time()
        tracer.start("1", root.pid, started, device=None, paths=paths, run_id=None, title="j")
        root.wait()
    peaks = tracer.end("1")
    tracer.close()
    samples = read_trace(paths.trace)
    assert peaks is not None and len(samples) == peaks.samples >= 4
    # one file, one clock: the second attempt's samples come after the first's
    elapsed = [s.elapsed_s for s in samples]
    assert elapsed == sorted(elapsed) and elapsed[-1] > 0.9


def test_peaks_and_the_trace_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    samples = [
        TraceSample(100.0, 1.0, 50.5, 99.5, 512.0, 30.0),
        TraceSample(101.0, 2.0, 80.25, 12.0, 256.0, 95.0),
    ]
    peaks = TracePeaks()
    for index, sample in enumerate(samples):
        append_sample(path, sample, new=index == 0)
        peaks = peaks.add(sample)
    with path.open("a") as handle:
        handle.write("102.0,3.0,9")  # a line cut short by a reader's timing: left out
    assert read_trace(path) == samples
    assert peaks == TracePeaks(2, 80.25, 99.5, 512.0, 95.0)
    append_sample(path, samples[0], new=True)  # a new trace replaces an old one's file
    assert read_trace(path) == samples[:1]
    assert samples[0].metrics()["job/gpu_mem_mb"] == 512.0


# -- NVML ---------------------------------------------------------------------------------


@dataclass
class FakeProcess:
    pid: int
    usedGpuMemory: int | None


class FakeNvml(types.ModuleType):
    """What the sampler uses of ``pynvml``, for one GPU whose compute processes a test sets."""

    class NVMLError(Exception):
        pass

    def __init__(self, processes: list[FakeProcess], util: int | None = 37) -> None:
        super().__init__("pynvml")
        self.processes = processes
        self.util = util
        self.calls: list[str] = []
        self.available = True

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if not self.available:
            raise self.NVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        if index != 0:
            raise self.NVMLError("Invalid Argument")
        return "gpu-0"

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[FakeProcess]:
        return list(self.processes)

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> Any:
        if self.util is None:
            raise self.NVMLError("Not Supported")
        return types.SimpleNamespace(gpu=self.util, memory=5)


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNvml]:
    fake = FakeNvml([])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    yield fake


def test_nvml_counts_the_memory_of_the_jobs_processes_only(fake_nvml: FakeNvml) -> None:
    fake_nvml.processes = [
        FakeProcess(101, 300 * MIB),
        FakeProcess(102, 200 * MIB),  # the job's DataLoader worker, say
        FakeProcess(999, 4096 * MIB),  # another job on the same GPU
        FakeProcess(103, None),  # NVML could not say
    ]
    sampler = NvmlSampler()
    usage = sampler.usage("0", [101, 102, 103])
    assert (usage.mem_mb, usage.util_percent) == (500.0, 37.0)
    fake_nvml.util = None  # e.g. a MIG instance: memory still, no utilisation
    assert sampler.usage("0", [999]) == GpuUsage(4096.0, None)
    sampler.close()
    assert fake_nvml.calls == ["init", "shutdown"]  # once for the tracer's life


def test_without_nvml_the_trace_goes_on_without_gpu_figures(
    fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    fake_nvml.available = False
    sampler = NvmlSampler()
    for _ in range(3):
        assert sampler.usage("0", [1]) == GpuUsage(None, None)
    assert fake_nvml.calls == ["init"]  # not tried again
    assert caplog.text.count("no GPU figures: NVML is not available") == 1
    other = NvmlSampler()
    fake_nvml.available = True
    assert other.usage("7", [1]).mem_mb is None  # a device NVML does not know
    assert "cannot read the processes on GPU '7'" in caplog.text


def test_a_gpu_job_is_traced_by_pid_over_its_process_tree(
    tmp_path: Path, holder_script: Path, fake_nvml: FakeNvml
) -> None:
    sink = Sink()
    tracer = ResourceTracer(0.2, sink)
    paths = JobPaths.of(tmp_path / "job")
    root = start_tree(holder_script, 10, 1.0)
    (worker,) = descendants(root.pid)
    # NVML sees the job's worker, not the job's own process, and a stranger
    fake_nvml.processes = [FakeProcess(worker, 700 * MIB), FakeProcess(os.getpid(), 50 * MIB)]
    tracer.start("1", root.pid, time.time(), device="0", paths=paths, run_id="r", title="j")
    root.wait()
    peaks = tracer.end("1")
    tracer.close()
    assert peaks is not None and (peaks.gpu_mem_mb, peaks.gpu_util_percent) == (700.0, 37.0)
    # the worker's memory from the first sample on; none once it has exited, which a sample
    # between its exit and its parent's (a loaded machine's) may see
    held = [s.gpu_mem_mb for s in read_trace(paths.trace)]
    assert held[0] == 700.0 and set(held) <= {700.0, 0.0}, held
    gone = held.index(0.0) if 0.0 in held else len(held)
    assert set(held[gone:]) <= {0.0}, held  # none again once the worker is gone
    names = {name for *_, values in sink.metrics for name in values}
    assert {"job/gpu_mem_mb", "job/gpu_util_percent"} <= names


@pytest.mark.gpu
@pytest.mark.skipif(not NvmlProbe().device_ids(), reason="no NVIDIA GPU here (NVML lists none)")
def test_real_nvml_sees_a_processes_cuda_memory(tmp_path: Path) -> None:
    code = (
        "import time, torch\n"
        "held = torch.ones(64 << 20, device='cuda')  # 256 MiB of float32\n"
        "torch.cuda.synchronize(); print('holding', flush=True); time.sleep(30)\n"
    )
    env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0"}
    job = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert job.stdout is not None and job.stdout.readline() == "holding\n"
        sampler = NvmlSampler()
        usage = sampler.usage("0", [job.pid])
        sampler.close()
    finally:
        job.kill()
        job.wait()
    assert usage.mem_mb is not None and usage.mem_mb >= 256
    assert usage.util_percent is not None and 0 <= usage.util_percent <= 100
