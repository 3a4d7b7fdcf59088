"""Run an Optuna study on the launcher's slots: a trial per free slot, told the moment it ends.

StudySweep (_study_sweep): the study opened, trials of dead sweeps recovered, n_trials counted
furcate launcher:  a SlotFeed (launching/slot_feed.py) asks each free slot's trial ──► submit
                   wait_any ──► tell (COMPLETE / PRUNED / FAIL) ──► ask the next at once
other launchers:   ask n_jobs ──► launch() the batch ──► tell all ──► next batch
each trial's job:  reports its monitored metric per epoch to the trial (_trial_reporting)
end: optimization_results.yaml + plots in the sweep dir, on the sweep's MLflow run;
     every trial of the study failed: an error of one line (_all_failed)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher

from furcate_hydra.launching.slot_feed import FeedPace, JobSource, SlotFeed
from furcate_hydra.launching.streaming import JobRequest, StreamingLauncher
from furcate_hydra.sweepers.sweep_returns import ReturnBatch
from furcate_hydra.sweepers.sweeper_base import SweepContext, save_multirun_config
from hydra_plugins.furcate_optuna_sweeper._all_failed import every_trial_failed
from hydra_plugins.furcate_optuna_sweeper._in_flight import trials_in_flight
from hydra_plugins.furcate_optuna_sweeper._options import OptunaOptions
from hydra_plugins.furcate_optuna_sweeper._results import write_results
from hydra_plugins.furcate_optuna_sweeper._study_sweep import StudySweep, TrialJob

__all__ = ["run_study"]

log = logging.getLogger(__name__)


def run_study(
    options: OptunaOptions, context: SweepContext, arguments: Sequence[str]
) -> list[ReturnBatch]:
    """Run the trials the study is missing; write and log its results; returns in job order."""
    sweep = StudySweep(options, context, arguments)
    sweep_dir = save_multirun_config(context.config).sweep_dir
    streaming = sweep.streaming
    if sweep.to_start:
        with sweep.reporting.serving():
            if sweep.reporting.prunes_here and streaming is not None:
                # the launcher's fork server first, while this is the process's one thread:
                # the prune service's starts with the first trial
                streaming.warm_up()
            if options.asynchronous and streaming is not None:
                _stream(sweep, streaming)
            else:
                _batches(sweep, context.launcher)
    # a study of failed trials has no results: its one line is the error below
    all_failed = every_trial_failed(sweep.study, sweep.tally.first_failed)
    results = write_results(sweep.study, sweep_dir) if all_failed is None else None
    ran = sweep.started > 0 and streaming is not None
    sweep_run = streaming.sweep_run_id if ran and streaming and sweep.runs else None
    if results is not None and sweep_run and sweep.runs is not None:
        sweep.runs.log_results(sweep_run, results.files, results.tags)
    tally = sweep.tally
    if tally.first_error is not None and tally.too_many_failures(1):
        log.error(
            "furcate_optuna: %d of %d trials failed (hydra.sweeper.max_failure_rate=%s)",
            tally.failed,
            tally.told,
            options.max_failure_rate,
        )
        raise tally.first_error
    if all_failed is not None:  # after the records: the launcher wrote them as the trials ended
        raise all_failed
    return sweep.returns.batches(None)


def _stream(sweep: StudySweep, launcher: StreamingLauncher) -> None:
    """Every free slot runs a trial, and (with a trial per slot) the next trial of each slot is
    asked and submitted ahead while the slots are busy: when a trial ends, its slot's next one
    starts at once, and the end is told after. A sampler that sees running trials (TPE's
    constant liar, on by default) counts the trials asked ahead as running ones."""
    trials = _TrialFeed(sweep, launcher)
    feed: SlotFeed[TrialJob] | None = None
    try:
        with launcher.streaming():
            concurrency = trials_in_flight(
                sweep.options.n_jobs,
                launcher.slot_count,
                sweep.to_start - sweep.started,
                batches=False,
            )
            trials.concurrency = concurrency
            # ahead only where every slot runs a trial: else a trial asked ahead would start
            # on a free slot, beyond n_jobs
            every_slot = concurrency >= launcher.slot_count
            ahead = min(concurrency, launcher.jobs_ahead) if every_slot else 0
            # n_jobs counts trials in flight: one waiting for another launcher's run counts
            feed = SlotFeed(launcher, trials, FeedPace(concurrency, ahead))
            feed.run()
    except BaseException as exc:
        held = [*(feed.unended() if feed is not None else []), *trials.waiting()]
        sweep.interrupted([job.trial for job in held], f"sweep stopped: {type(exc).__name__}")
        raise


class _TrialFeed(JobSource[TrialJob]):
    """The study as a slot feed's source: asks trials as jobs, tells each its job's return.

    A trial sampled with the config of one running (or in the same batch) follows it instead
    of running twice: it is told its leader's outcome.
    """

    def __init__(self, sweep: StudySweep, launcher: StreamingLauncher) -> None:
        self.sweep = sweep
        self.launcher = launcher
        self.concurrency = 1  # set once the launcher's slots are known
        self.stopping = False  # too many failures: no new trial starts
        self._running: dict[int, TrialJob] = {}  # submitted, by job number, in that order
        self._followers: dict[int, list[TrialJob]] = {}  # by their leader's job number

    def waiting(self) -> list[TrialJob]:
        """The followers of trials still running."""
        return [job for jobs in self._followers.values() for job in jobs]

    def has_more(self) -> bool:
        return self.sweep.started < self.sweep.to_start and not self.stopping

    def take(self, count: int) -> list[tuple[JobRequest, TrialJob]]:
        """Up to ``count`` new trials as jobs, submitted in one batch (one store lookup)."""
        sweep = self.sweep
        jobs: list[TrialJob] = []
        asked = 0
        try:
            while asked < count and sweep.started < sweep.to_start:
                sweep.recount()
                if sweep.started >= sweep.to_start:
                    break
                trial, task = sweep.ask()
                asked += 1
                running = [*self._running.values(), *jobs]
                leader = next((j for j in running if j.task == tuple(task)), None)
                if leader is not None:
                    follower = sweep.job(trial, task, leader)
                    self._followers.setdefault(leader.num, []).append(follower)
                    continue
                jobs.append(sweep.job(trial, task))
        except BaseException as exc:
            why = f"sweep stopped: {type(exc).__name__}"
            sweep.interrupted([job.trial for job in jobs], why)
            raise
        self._running.update((job.num, job) for job in jobs)
        return [(job.request(), job) for job in jobs]

    def ended(self, item: TrialJob, key: str, job_return: JobReturn) -> None:
        sweep = self.sweep
        del self._running[item.num]
        sweep.tell(item, job_return, key)
        for follower in self._followers.pop(item.num, []):
            sweep.tell(follower, job_return, key, leader=item)
        if not self.stopping and sweep.tally.too_many_failures(self.concurrency):
            self.stopping = True
            log.error(
                "furcate_optuna: too many failed trials (hydra.sweeper.max_failure_rate=%s): "
                "no new trial starts, %d running go on",
                sweep.options.max_failure_rate,
                len(self._running),
            )

    def round_done(self) -> None:
        sweep = self.sweep
        to_come = 0 if self.stopping else sweep.to_start - sweep.started
        self.launcher.sweep_status(
            to_come=to_come, best=sweep.tally.best, pruned=sweep.tally.pruned
        )


def _batches(sweep: StudySweep, launcher: Launcher) -> None:
    """hydra-optuna-sweeper's loop: ask a batch, launch it, wait for all of it, tell it."""
    if sweep.streaming is None:  # another launcher: its slots are unknown here
        size = sweep.options.n_jobs or 1
    else:
        size = trials_in_flight(
            sweep.options.n_jobs, sweep.streaming.slot_count, sweep.to_start, batches=True
        )
    while sweep.started < sweep.to_start:
        sweep.recount()
        count = min(size, sweep.to_start - sweep.started)
        if count <= 0:
            break
        jobs: list[TrialJob] = []
        try:
            for _ in range(count):
                jobs.append(sweep.job(*sweep.ask()))
            results = launcher.launch([job.batch_overrides() for job in jobs], jobs[0].num)
        except BaseException as exc:
            sweep.interrupted([job.trial for job in jobs], f"sweep stopped: {type(exc).__name__}")
            raise
        for job, job_return in zip(jobs, results, strict=True):
            # the furcate launcher keys a job by its number, in launch() as in submit()
            sweep.tell(job, job_return, str(job.num))
        if sweep.tally.too_many_failures(len(jobs)):
            return
