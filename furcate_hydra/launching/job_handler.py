"""What becomes of each job of a launch session, from its request to its JobReturn.

compose(request) ──► a Job: its config (SweepComposer), its dirs, its environment
submitting(job)  ──► its payload; counted submitted in the progress view
on_event(event)  ──► STARTED: told to the run ledger, its resource trace and jobs_per_gpu=auto's
                     watch started; PREEMPTED: counted and recorded; ENDED otherwise than
                     finished, under fail_fast: no more jobs start
finished(job)    ──► its JobReturn, recorded (run ledger) with its trace's peaks, counted in the
                     summary and the view; a failure under fail_fast stops the sweep
not_run / not_started ──► the same for jobs the scheduler did not run

The scheduler's ``Handler`` (it builds the scheduler) and the executor's listener; the session
(``launching.launch_session``) starts and stops what they use.
"""

from __future__ import annotations

from collections.abc import Callable

from hydra.core.utils import JobReturn, JobStatus

from furcate_hydra import env_vars
from furcate_hydra.execution.executor import EventKind, Executor, JobEvent
from furcate_hydra.execution.gpu.packing import GpuPacking
from furcate_hydra.execution.job import Job
from furcate_hydra.hydra_api.task_config import as_job, task_container
from furcate_hydra.job_process.job_context import job_payload
from furcate_hydra.job_process.rank_processes import launch_env
from furcate_hydra.launching.compose import SweepComposer
from furcate_hydra.launching.job_dirs import check_job_paths, job_output_dir
from furcate_hydra.launching.launcher_options import LauncherOptions
from furcate_hydra.launching.requested_jobs import job_config, job_label, job_name
from furcate_hydra.launching.session_view import SessionView
from furcate_hydra.launching.streaming import JobRequest
from furcate_hydra.layout import JobPaths
from furcate_hydra.records.job_returns import error_text, how_it_ended, to_job_return
from furcate_hydra.records.run_ledger import RunLedger
from furcate_hydra.scheduling import Scheduler
from furcate_hydra.store.trace_log import TraceLog
from furcate_hydra.tracing import ResourceTracer, TracePeaks
from furcate_hydra.tracing.packing_watch import PackingWatch

__all__ = ["JobHandler", "jobs_env", "start_tracer"]

# Seconds between a job's progress writes under jobs_per_gpu=auto, whose steps/s they give.
AUTO_PROGRESS_EVERY_S = 1.0


class JobHandler:
    """Each job composed, traced, turned into a JobReturn, recorded and shown (see the module
    doc). ``warm_up``: what the session starts before the first job runs; True if now."""

    def __init__(
        self,
        executor: Executor,
        ledger: RunLedger,
        shown: SessionView,
        composer: SweepComposer,
        job_env: dict[str, str],
        packing: GpuPacking | None,
        fail_fast: bool,
        warm_up: Callable[[], bool],
    ) -> None:
        self.ledger = ledger
        self.shown = shown
        self.composer = composer
        self.packing = packing
        self.fail_fast = fail_fast
        self._job_env = job_env  # every job's, before its own
        self._warm_up = warm_up
        # started with the first job that runs (start_tracing): its thread would keep the
        # fork server from being a fork, its MLflow client would load MLflow for a rerun
        self.tracer: ResourceTracer | None = None
        self.watch: PackingWatch | None = None  # jobs_per_gpu=auto's readings
        self.scheduler: Scheduler[JobReturn] = Scheduler(executor, ledger, self, fail_fast)

    def start_tracing(self, interval_s: float) -> None:
        """The jobs' resource trace (none when ``interval_s`` is 0) and jobs_per_gpu=auto's
        watch, from the first job that runs."""
        self.tracer = start_tracer(interval_s, self.ledger.tracking_uri)
        if self.packing is not None and self.packing.grows:
            self.watch = PackingWatch(self.packing, self.packing.budgets())

    def give_up(self) -> tuple[list[Job], dict[str, TracePeaks | None]]:
        """The executor closed: the jobs the scheduler still held, counted as stopped in the
        summary, and their trace's peaks; the trace and the watch closed (the last metrics and
        plots, before the store closes)."""
        held = self.scheduler.give_up()
        self.shown.stopped(held)  # the summary counts what the interrupt stopped
        peaks = {job.key: self._end_trace(job.key) for job in held}
        if self.watch is not None:
            self.watch.close()
        if self.tracer is not None:
            self.tracer.close()
        return held, peaks

    def compose(self, request: JobRequest) -> Job:
        """The job a request asks for: its config, output dir and environment."""
        num = request.num
        sweep_config = job_config(self.composer, request)
        with as_job(sweep_config):
            check_job_paths(sweep_config, self.ledger.sweep.sweep_dir, job_name(request))
            paths = JobPaths.of(job_output_dir(sweep_config))
            task = task_container(sweep_config)
        return Job(
            key=str(num),
            num=num,
            overrides=tuple(request.overrides),
            label=job_label(request),
            paths=paths,
            env={**self._job_env, **request.env},
            config=sweep_config,
            task_config=task,
        )

    def on_event(self, event: JobEvent) -> None:
        """The executor's listener: a job started, was preempted, or ended."""
        if self.packing is not None and event.kind is not EventKind.PROGRESS:
            self.shown.show_packing(self.packing)
        if self.watch is not None and event.kind is not EventKind.PROGRESS:
            self._watch(event)
        if event.kind is EventKind.STARTED:
            job = event.job
            self.ledger.started(job)
            # the tracer reads this machine's processes: a job on a Ray node has a pid there
            if self.tracer is not None and job.pid is not None and job.node is None:
                self.tracer.start(
                    job.key,
                    job.pid,
                    job.started_at or event.at,
                    device=job.slot.device if job.slot is not None else None,
                    paths=job.paths,
                    run_id=job.run_id,
                    title=f"job {job.name}",
                )
        elif event.kind is EventKind.PREEMPTED:
            self.shown.summary.preempted()
            self.ledger.preempted(event.job)
        elif event.kind is EventKind.ENDED and self.fail_fast and not self.scheduler.stopped_by:
            job = event.job
            job_return = to_job_return(job)
            if job_return.status is not JobStatus.COMPLETED:
                how = how_it_ended(job, error_text(job, job_return))
                if how != "not started":
                    self.scheduler.ended_badly(job, how)

    # -- the scheduler's handler ----------------------------------------------------------

    def warm_up(self) -> bool:
        return self._warm_up()

    def start_view(self) -> None:
        self.shown.start()

    def submitting(self, job: Job) -> None:
        job.payload = job_payload(job.config)
        self.shown.tally.submitted()  # before submit: the executor may start it at once

    def not_run(self, job: Job, result: JobReturn) -> None:
        self._stop_if_failed(job, self.shown.not_run(job, result))

    def finished(self, job: Job) -> JobReturn:
        peaks = self._end_trace(job.key)
        job_return = to_job_return(job)
        self.ledger.record(job, job_return, peaks)
        self._stop_if_failed(job, self.shown.finished(job, job_return, peaks))
        return job_return

    def not_started(self, job: Job) -> JobReturn:
        job_return = to_job_return(job)
        self.shown.tally.finished(False)
        self._stop_if_failed(job, self.shown.did_not_finish(job, job_return))
        return job_return

    def _stop_if_failed(self, job: Job, how: str | None) -> None:
        if how is not None and how != "not started":
            self.scheduler.failed(job, how)

    def _watch(self, event: JobEvent) -> None:
        """Tell jobs_per_gpu=auto's watch that a job's process runs on a GPU, or not."""
        assert self.watch is not None
        job = event.job
        device = job.slot.device if job.slot is not None else None
        if event.kind is EventKind.STARTED and job.pid is not None and device is not None:
            self.watch.start(job.key, job.pid, device, job.paths.progress)
        elif event.kind is not EventKind.STARTED:
            self.watch.end(job.key)  # it ended, or is queued again

    def _end_trace(self, key: str) -> TracePeaks | None:
        return self.tracer.end(key) if self.tracer is not None else None


def jobs_env(options: LauncherOptions, packing: GpuPacking | None) -> dict[str, str]:
    """The environment every job starts with, before its own."""
    env = options.training.job_env()
    env.update(launch_env())  # how the app was started: for DDP's other ranks
    if packing is not None and packing.grows:  # auto reads steps/s from the progress writes
        env[env_vars.PROGRESS_EVERY_S] = repr(AUTO_PROGRESS_EVERY_S)
    return env


def start_tracer(interval_s: float, tracking_uri: str | None) -> ResourceTracer | None:
    """The resource trace of the session's jobs, into their runs when recording; None when
    ``hydra.launcher.trace_interval_s`` is 0."""
    if interval_s <= 0:
        return None
    sink = TraceLog(tracking_uri) if tracking_uri else None
    return ResourceTracer(interval_s, sink)
