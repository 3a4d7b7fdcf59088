"""The launcher's per-job resource trace: a thread that samples every running job's processes.

    owner thread:  start(job) ─┐                       ┌─ end(job) ──► its peaks, at once
                               ▼                       ▼
    tracer thread: every interval_s per job: process tree (psutil) [+ GPU (NVML)] ──► sample
                   ──► trace.csv (a line) ──► peaks ──► metrics, to the sink in batches
                   when a job ended: its last metrics, plots/resource_trace.png, files to the sink

The launcher samples, not the job, so a job that is killed (by the OOM killer, say) keeps its
trace up to its death. The owner thread only takes a lock and touches a dict: reading /proc and
NVML, writing files, plotting and every store call happen on the tracer's own thread, off the
path that hands jobs their slots. A job's first sample is ``interval_s`` after it starts, so a
job shorter than that has no trace.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from furcate_hydra.execution.gpu.groups import slot_devices
from furcate_hydra.layout import JobPaths
from furcate_hydra.tracing.gpu import GpuUsage, NvmlSampler, over_gpus
from furcate_hydra.tracing.plot import TracePlotter
from furcate_hydra.tracing.process_tree import MIB, TreeUsage, tree_usage
from furcate_hydra.tracing.samples import TracePeaks, TraceSample, append_sample, read_trace

__all__ = ["GpuSampler", "MetricRow", "ResourceTracer", "TraceSink"]

log = logging.getLogger(__name__)

# A traced job's metrics wait at most this long before they are sent in one batch.
FLUSH_EVERY_S = 30.0
# How long closing waits for the thread to send and draw what is left.
CLOSE_TIMEOUT_S = 60.0

# (step, time, {metric name: value}): one sample as metrics
MetricRow = tuple[int, float, Mapping[str, float]]


class TraceSink(Protocol):
    """Where samples go besides trace.csv (the job's MLflow run). Called on the tracer's
    thread only; an error is logged there and the trace goes on."""

    def log_metrics(self, run_id: str, rows: Sequence[MetricRow]) -> None:
        """Log samples into a run, in as few calls as the store allows."""
        ...

    def log_files(self, run_id: str, files: Sequence[tuple[Path, str | None]]) -> None:
        """Upload ``(file, artifact folder)`` pairs into a run."""
        ...


class GpuSampler(Protocol):
    def usage(self, device: str, pids: Sequence[int]) -> GpuUsage: ...

    def close(self) -> None: ...


@dataclass(eq=False)
class _Job:
    """A traced job. Its fields change under the tracer's lock; its trace file and metrics
    are the tracer thread's alone."""

    key: str
    paths: JobPaths
    run_id: str | None
    title: str
    first_start: float
    pid: int
    device: str | None
    due: float
    cpu_mark: tuple[float, float]  # (the tree's CPU seconds, when) at the last sample
    attempt: int = 1  # a retry's new process makes older samples stale
    peaks: TracePeaks = field(default_factory=TracePeaks)
    unsent: list[MetricRow] = field(default_factory=list)
    sent_at: float = field(default_factory=time.monotonic)


class ResourceTracer:
    """Samples the jobs it is told about on a thread of its own (see the module doc).

    ``start`` and ``end`` are called by one owner thread and never block on I/O; ``close``
    waits for the thread to finish what ended jobs left (their metrics and plots).
    """

    def __init__(
        self,
        interval_s: float,
        sink: TraceSink | None,
        gpu: GpuSampler | None = None,
        flush_every_s: float = FLUSH_EVERY_S,
    ) -> None:
        self.interval_s = interval_s
        self._sink = sink
        self._gpu: GpuSampler = gpu or NvmlSampler()
        self._flush_every_s = flush_every_s
        self._cond = threading.Condition()
        self._jobs: dict[str, _Job] = {}
        self._ended: list[_Job] = []
        self._closing = False
        self._sink_failed: set[str] = set()  # runs already warned about
        self._plotter = TracePlotter()  # the tracer thread's own
        # when the thread, waiting, will wake by itself; None while it works (it looks at the
        # jobs again before it waits)
        self._asleep_until: float | None = None
        self._thread = threading.Thread(target=self._run, name="furcate-trace", daemon=True)
        self._thread.start()

    @property
    def thread_id(self) -> int | None:
        """The tracer thread's id as the kernel knows it (to measure its CPU time)."""
        return self._thread.native_id

    # -- the owner's thread --------------------------------------------------------------

    def start(
        self,
        key: str,
        pid: int,
        started_at: float,
        *,
        device: str | None,
        paths: JobPaths,
        run_id: str | None,
        title: str,
    ) -> None:
        """Trace the process ``pid`` started for job ``key``; a retry's process replaces the
        crashed one in the same trace. ``device``: its slot's (one GPU, several
        comma-separated, or None on CPU)."""
        with self._cond:
            job = self._jobs.get(key)
            if job is None:
                self._jobs[key] = _Job(
                    key=key,
                    paths=paths,
                    run_id=run_id,
                    title=title,
                    first_start=started_at,
                    pid=pid,
                    device=device,
                    due=started_at + self.interval_s,
                    cpu_mark=(0.0, started_at),
                )
            else:
                job.pid, job.device, job.attempt = pid, device, job.attempt + 1
                job.due, job.cpu_mark = started_at + self.interval_s, (0.0, started_at)
            self._wake_for(started_at + self.interval_s)

    def end(self, key: str) -> TracePeaks | None:
        """Stop tracing job ``key``; its peaks, or None when it had no sample (or no trace)."""
        with self._cond:
            job = self._jobs.pop(key, None)
            if job is None or not job.peaks.samples:
                return None
            self._ended.append(job)
            self._cond.notify()
            return job.peaks

    def _wake_for(self, due: float) -> None:
        """Wake the thread only if it would sleep past ``due``: waking it takes the GIL from
        the owner's thread, which on a busy machine costs that thread milliseconds, and a
        job shorter than the interval is never sampled anyway."""
        if self._asleep_until is not None and due < self._asleep_until:
            self._cond.notify()

    def close(self) -> None:
        """Stop sampling; send and draw what traced jobs left, then stop the thread."""
        with self._cond:
            self._closing = True
            self._ended += [job for job in self._jobs.values() if job.peaks.samples]
            self._jobs.clear()
            self._cond.notify()
        self._thread.join(CLOSE_TIMEOUT_S)
        if self._thread.is_alive():
            log.warning("furcate: the resource trace did not finish in %.0f s", CLOSE_TIMEOUT_S)

    # -- the tracer's thread -------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                due, ended, closing = self._wait_for_work()
                for job, pid, attempt in due:
                    self._sample(job, pid, attempt)
                for job in ended:
                    self._finish(job)
                if closing and not due and not ended:
                    return
        except Exception:  # never takes the launcher down; its jobs go on untraced
            log.exception("furcate: the resource trace stopped")
        finally:
            self._gpu.close()

    def _wait_for_work(self) -> tuple[list[tuple[_Job, int, int]], list[_Job], bool]:
        """The jobs due for a sample (each rescheduled), those that ended, whether closing."""
        with self._cond:
            while True:
                now = time.time()
                due = [job for job in self._jobs.values() if job.due <= now]
                if due or self._ended or self._closing:
                    break
                next_due = min((job.due for job in self._jobs.values()), default=math.inf)
                self._asleep_until = next_due
                self._cond.wait(None if next_due == math.inf else next_due - now)
                self._asleep_until = None
            for job in due:
                # keep the cadence; after a stall, the next sample is a full interval away
                job.due = max(job.due + self.interval_s, now + self.interval_s / 2)
            ended, self._ended = self._ended, []
            return [(job, job.pid, job.attempt) for job in due], ended, self._closing

    def _sample(self, job: _Job, pid: int, attempt: int) -> None:
        usage = tree_usage(pid)
        if usage is None:
            return  # its process has ended; the launcher ends the job soon
        devices = slot_devices(job.device)  # a job of several GPUs: on each of them
        gpu = over_gpus([self._gpu.usage(d, usage.pids) for d in devices]) if devices else None
        now = time.time()
        with self._cond:
            if self._jobs.get(job.key) is not job or job.attempt != attempt:
                return  # ended, or restarted, while it was read
            sample = self._sample_of(job, usage, gpu, now)
            first = not job.peaks.samples
            job.peaks = job.peaks.add(sample)
            job.unsent.append((job.peaks.samples, now, sample.metrics()))
        try:
            job.paths.output_dir.mkdir(parents=True, exist_ok=True)
            append_sample(job.paths.trace, sample, new=first)
        except OSError as exc:
            log.warning("furcate: could not write %s: %s", job.paths.trace, exc)
        if time.monotonic() - job.sent_at >= self._flush_every_s:
            self._send(job)

    def _sample_of(
        self, job: _Job, usage: TreeUsage, gpu: GpuUsage | None, now: float
    ) -> TraceSample:
        cpu_s, then = job.cpu_mark
        job.cpu_mark = (usage.cpu_s, now)
        # a descendant that ended unwaited-for takes its CPU time with it: never below 0
        cpu_percent = max(0.0, usage.cpu_s - cpu_s) / max(now - then, 1e-3) * 100.0
        return TraceSample(
            time=now,
            elapsed_s=now - job.first_start,
            rss_mb=usage.rss_bytes / MIB,
            cpu_percent=cpu_percent,
            gpu_mem_mb=None if gpu is None else gpu.mem_mb,
            gpu_util_percent=None if gpu is None else gpu.util_percent,
        )

    def _finish(self, job: _Job) -> None:
        """A job that ended: its last metrics, its plot, its files in its run."""
        self._send(job)
        files: list[tuple[Path, str | None]] = [(job.paths.trace, None)]
        if job.peaks.samples >= 2:  # a single point is no curve
            try:
                self._plotter.plot(read_trace(job.paths.trace), job.paths.trace_plot, job.title)
                files.append((job.paths.trace_plot, JobPaths.PLOTS))
            except Exception as exc:  # a trace without its plot is still a trace
                log.warning("furcate: could not plot the resource trace of %s: %s", job.title, exc)
        there = [(path, folder) for path, folder in files if path.exists()]
        self._to_sink(job, lambda sink, run_id: sink.log_files(run_id, there))

    def _send(self, job: _Job) -> None:
        rows, job.unsent = job.unsent, []
        job.sent_at = time.monotonic()
        if rows:
            self._to_sink(job, lambda sink, run_id: sink.log_metrics(run_id, rows))

    def _to_sink(self, job: _Job, call: Callable[[TraceSink, str], None]) -> None:
        if self._sink is None or job.run_id is None:
            return
        try:
            call(self._sink, job.run_id)
        except Exception as exc:  # a busy or gone store must not stop the trace
            if job.run_id not in self._sink_failed:
                self._sink_failed.add(job.run_id)
                log.warning(
                    "furcate: could not log the resource trace into MLflow run %s: %s",
                    job.run_id,
                    exc,
                )
