"""The furcate launcher's session: what a sweep runs on, started, warmed up and stopped.

submit_batch(requests) ──► compose each job's config (JobHandler: SweepComposer, job num/id)
                       ──► the scheduler: the run ledger decides (skip / resume / run), claims, and
                           the jobs to run go to the executor
                       ──► the first job that is not skipped warms the session up (warm_up): the
                           fork server (a fork of this process), then MLflow opens the store; a
                           sweep whose every job is skipped starts neither
wait_any ──► the scheduler's results: JobReturns (the task's own, or built for a job that did
             not run to a report), each recorded by the handler (run ledger: run's final
             status, return value, artifacts, run data) and counted in the summary and the
             progress view
streaming() ──► Hydra's logging, the sweep dir; the summary and the stream's counts at its end;
                on Ctrl-C or SIGTERM (or Slurm's time limit) every job stopped and recorded
close() ──► the executor stopped, jobs still running recorded KILLED, the sweep's final state

What becomes of each job (its JobReturn, its record, the summary) is the scheduler's handler's
(``launching.job_handler``); the session plans, starts and stops what it runs on.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from hydra.core.utils import JobReturn, configure_log
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from furcate_hydra.errors import ExecutorBrokenError, FurcateConfigError
from furcate_hydra.execution import interrupts
from furcate_hydra.execution.job import Job
from furcate_hydra.hydra_api.options import as_option_error
from furcate_hydra.job_process.job_context import HydraJobContext, context_blob, fork_context
from furcate_hydra.job_process.lightning_auto import OFF as LIGHTNING_OFF
from furcate_hydra.launching.backends import gpu_packing, plan_for, start_executor
from furcate_hydra.launching.compose import SweepComposer
from furcate_hydra.launching.job_dirs import check_job_name
from furcate_hydra.launching.job_handler import JobHandler, jobs_env
from furcate_hydra.launching.launcher_options import LauncherOptions
from furcate_hydra.launching.session_view import SessionView, log_interrupted, log_stream_counts
from furcate_hydra.launching.streaming import JobRequest, JobRun
from furcate_hydra.records.run_ledger import RunLedger
from furcate_hydra.records.task_code import task_code_version
from furcate_hydra.scheduling import Scheduler
from furcate_hydra.slurm.session import SlurmSession
from furcate_hydra.tracing import ResourceTracer

log = logging.getLogger(__name__)

__all__ = ["LaunchSession"]


class LaunchSession:
    """An executor plus the Hydra context: overrides become jobs, finished jobs JobReturns.

    Lives as long as its launcher, so a sweeper calling ``launch`` batch after batch (or using
    ``submit_batch``/``wait_any``) keeps one warm pool. What runs when is its scheduler's; what
    becomes of each job is its handler's (``JobHandler``); the session starts, warms up and
    stops what they use, and answers the sweeper.
    """

    def __init__(
        self,
        options: LauncherOptions,
        hydra_context: HydraContext,
        task_function: TaskFunction,
        config: DictConfig,
        composer: SweepComposer | None = None,
    ) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function
        # Plan before anything runs, so bad options cost nothing. Nothing starts here: the
        # fork server and the store wait for the first job that is not skipped (warm_up).
        check_job_name(config)  # it names the store's experiment
        try:
            self.slurm = SlurmSession.detect(options.slurm)
            plan = plan_for(options, self.slurm.cpus() if self.slurm else None)
            code = task_code_version(task_function, config)
            where = self.slurm.tags() if self.slurm else None
            self.ledger = RunLedger(options.store, config, code, where)
        except FurcateConfigError as exc:
            raise as_option_error(exc) from None
        if self.slurm is not None:
            log.info("furcate: in %s", self.slurm.job.describe())
        log.info("furcate: %s", plan.describe())
        if options.pool.fuse_max > 1 and options.training.lightning == LIGHTNING_OFF:
            # the app's own Trainer is then never reached: its jobs would run alone unsaid
            log.warning(
                "furcate: hydra.launcher.fuse=auto with hydra.launcher.lightning=off fuses only "
                "jobs that train through furcate's fit; a Trainer the task builds itself trains "
                "alone (set hydra.launcher.lightning=auto to fuse those too)"
            )
        self._context = self._context_blob()
        self.packing = gpu_packing(plan, options.slots)  # None for CPU and Ray slots
        slots = len(plan.slots) if self.packing is None else self.packing.open_slots()
        self.shown = SessionView(options.progress, slots, self.ledger.sweep.summary)
        self._warm = False
        view = self.shown.view
        output = view.write_output if view.owns_output else None
        sweep_dir = Path(str(config.hydra.sweep.dir)).absolute()
        self.executor = start_executor(
            plan, self._context, options, output, self._fork_context, self.packing, sweep_dir
        )
        self._trace_interval_s = options.trace_interval_s  # the trace starts in warm_up
        self.fail_fast = options.fail_fast
        # preload unset: the fork server learns what the jobs import (preload=[]: it does not)
        self._learn_imports = options.pool.preload is None
        self.handler = JobHandler(
            self.executor,
            self.ledger,
            self.shown,
            composer or SweepComposer(hydra_context, config),
            jobs_env(options, self.packing),
            self.packing,
            options.fail_fast,
            self.warm_up,
        )
        self.scheduler: Scheduler[JobReturn] = self.handler.scheduler
        self.executor.add_listener(self.shown.tally.on_event)
        self.executor.add_listener(self.handler.on_event)
        self.in_stream = False  # inside streaming(): the summary is written when it ends
        self._closed = False

    @classmethod
    def start(
        cls,
        options: LauncherOptions,
        hydra_context: HydraContext,
        task_function: TaskFunction,
        config: DictConfig,
        composer: SweepComposer | None = None,
    ) -> LaunchSession:
        """A new session, its signal handlers installed before the fork server's warm-up, so
        that a Ctrl-C during it is never lost; one during it ends the app with one line.
        ``composer``: one the caller composed jobs with already (its configs are cached)."""
        interrupts.install()
        try:
            return cls(options, hydra_context, task_function, config, composer)
        except KeyboardInterrupt:
            interrupts.restore()
            log.warning("furcate: interrupted while starting; no job ran")
            raise SystemExit(128 + (interrupts.received() or signal.SIGINT)) from None
        except BaseException:
            interrupts.restore()
            raise

    def refresh_context(self) -> None:
        """Ship the singleton state to the fork server again if it changed (new resolvers)."""
        context = self._context_blob()
        if context != self._context:
            self._context = context
            self.executor.set_context(context)

    def submit_batch(self, requests: Sequence[JobRequest]) -> list[Job]:
        """Compose jobs and hand them to the scheduler (one store lookup for the batch, one
        claim). Jobs already recorded as FINISHED are not run: their JobReturns, carrying the
        recorded return value, come out of the next ``wait_any``. Jobs whose config another
        launcher holds come out once it ended there, with its outcome."""
        jobs = [self.handler.compose(request) for request in requests]
        self.scheduler.submit(jobs)
        return jobs

    def wait_any(self, timeout: float | None = None) -> list[tuple[str, JobReturn]]:
        """Jobs that ended: here, or (held elsewhere) in another launcher; at least one unless
        ``timeout`` passed or nothing is in flight."""
        return self.scheduler.wait_any(timeout)

    def warm_up(self) -> bool:
        """What the first job that is not skipped does first (once; callable before, as the
        benchmarks do): MLflow's modules, then the fork server (a fork of this process: it
        gets them, and the task's, for free; made before the store opens, so it shares no
        connection), then the store while the server loads anything it still needs, then
        wait for the server. A Ctrl-C during it ends the app with one line. True if the
        session warmed up now."""
        if self._warm:
            return False
        try:
            self.ledger.load_store_modules()
            self.executor.start()  # with hydra.launcher.mps=on, an error where MPS cannot run
            self.ledger.open_store()
            self._preload_remembered()
            self.executor.wait_ready()
            self.handler.start_tracing(self._trace_interval_s)
        except KeyboardInterrupt:
            log.warning("furcate: interrupted while starting; no job ran")
            raise SystemExit(128 + (interrupts.received() or signal.SIGINT)) from None
        except FurcateConfigError as exc:
            raise as_option_error(exc) from None
        self._warm = True
        return True

    def job_run(self, key: str) -> JobRun:
        """A submitted job's MLflow run: its own, or the one it waits for elsewhere."""
        held = self.scheduler.held_elsewhere(key)
        if held is not None:
            return JobRun(held.run_id, elsewhere=True)
        return self.ledger.job_run(key)

    def job_pruned(self, key: str, epoch: int | None) -> None:
        """A handed-back job whose trial the sweeper pruned: its row in the summary says at
        which epoch. Told after the sweep's ``launch`` returned (a batch sweeper tells its
        trials then), summary.md is written again with it."""
        row = self.ledger.row(key)
        if row is None:
            return
        self.shown.pruned(row, epoch)
        if not self.in_stream:
            self.shown.write_summary(console=False)

    @property
    def composer(self) -> SweepComposer:
        return self.handler.composer

    @property
    def tracer(self) -> ResourceTracer | None:
        """The jobs' resource trace, from warm_up; None when off."""
        return self.handler.tracer

    @property
    def idle_slots(self) -> int:
        return self.executor.idle_slots

    @property
    def jobs_ahead(self) -> int:
        """Jobs worth submitting beyond the free slots: forked ahead, one per slot, each starts
        the moment a slot frees. 0 under fail_fast, where no job may start on the slot of
        one that failed (and a job never started should have no run)."""
        return 0 if self.fail_fast else self.executor.slot_count

    def sweep_status(
        self, to_come: int | None = None, best: str | None = None, pruned: int | None = None
    ) -> None:
        """What the sweeper knows for the progress view: jobs it will still submit, its best
        result so far, trials it pruned."""
        self.shown.tally.sweeper_status(to_come, best, pruned)

    @contextmanager
    def streaming(self) -> Iterator[None]:
        """Hydra's logging and the sweep dir set up before the first job; on Ctrl-C or SIGTERM
        every job's process group is stopped before the launcher goes; the sweep's run data is
        written when it ends."""
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        self.refresh_context()
        counts = self.scheduler.new_stream()
        self.in_stream = True
        try:
            yield  # the view starts with the first job that runs (the handler's start_view)
            self.shown.stop()
            self.ledger.flush()
            self.shown.summary.pruned(self.shown.tally.snapshot().pruned)
            self.shown.write_summary()
            log_stream_counts(counts, self.ledger.code)
        except ExecutorBrokenError:
            self.shown.stop()
            self.close()  # the sweep failed; it was not interrupted
            raise
        except KeyboardInterrupt:
            signum = interrupts.received() or signal.SIGINT
            preempted = self.slurm.preempted_by(signum) if self.slurm else None
            stopped = self.close(interrupted=True, preempted=preempted)
            with contextlib.suppress(OSError):  # the summary of what did run, if it can be
                self.shown.write_summary()
            if self.slurm is not None and preempted is not None:
                # the last act: requeueing ends this run of the Slurm job
                log_preempted(self.slurm, stopped, self.slurm.requeue_now())
            else:
                log_interrupted(signum, stopped, self.ledger.sweep.sweep_dir)
            # No traceback: the shell's convention for a process ended by a signal
            raise SystemExit(128 + signum) from None
        except BaseException:
            self.close(interrupted=True)
            raise
        finally:
            self.in_stream = False

    def close(self, interrupted: bool = False, preempted: str | None = None) -> int:
        """Stop the executor; record jobs still running as KILLED (``preempted``: and why,
        counted as a preemption) and the sweep's final state. Returns how many jobs were
        stopped."""
        if self._closed:
            return 0
        self._closed = True
        self.shown.stop()
        self.executor.close()
        if self._learn_imports:
            self.ledger.remember_imports(self.executor.learned_imports)
        held, peaks = self.handler.give_up()
        self.ledger.close(interrupted, held, peaks, preempted)
        interrupts.restore()
        return len(held)

    def _preload_remembered(self) -> None:
        """What this app's jobs imported themselves in its earlier sweeps: the fork server
        imports it now (holding the first fork until it is in), and the launch says so."""
        if not self._learn_imports:
            return
        missing = [name for name in self.ledger.remembered_imports() if name not in sys.modules]
        if missing:
            log.info(
                "furcate: the fork server preloads %s: this app's jobs imported them themselves "
                "in its earlier sweeps (hydra.launcher.preload sets the list; preload=[] "
                "learns nothing)",
                ", ".join(missing),
            )
            self.executor.preload(missing)

    def _fork_context(self) -> HydraJobContext | None:
        return fork_context(self.task_function, self.hydra_context, self.ledger.tracking_uri)

    def _context_blob(self) -> bytes:
        return context_blob(self.task_function, self.hydra_context, self.ledger.tracking_uri)


def log_preempted(slurm: SlurmSession, stopped: int, requeued: bool) -> None:
    """What Slurm's time-limit signal stopped, and what comes next."""
    then = (
        "requeued: its next run resumes them"
        if requeued
        else "not requeued: run the same command (sbatch the script again) to resume them"
    )
    log.warning(
        "furcate: %s reached its time limit (SIGUSR1): %d job%s stopped at a checkpoint and "
        "recorded preempted; %s",
        slurm.job.describe(),
        stopped,
        "" if stopped == 1 else "s",
        then,
    )
