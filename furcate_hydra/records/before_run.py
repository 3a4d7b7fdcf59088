"""Before a job runs: decide skip / resume / run, claim its config, open its MLflow run.

prepare(jobs) ──► fingerprints ──► one store lookup ──► a Decision per job (a sqlite store is
                 read without MLflow until something must be written: needs_store)
claim(jobs, decisions) ──► jobs to run or resume: a claim each, one lookup of rivals ──►
                           lost ones become ELSEWHERE (another launcher holds the config)
open_run(job, decision) ──► interrupted/KILLED → same run again, resumes from its checkpoint dir
                            otherwise          → the claim's new RUNNING run (tags, params)
follow(waiting) ──► one lookup: configs held elsewhere that ended (their outcome, as a skip
                    or a failure) or were let go (decided again)
The first batch writes furcate_sweep.json, which says where the sweep records (``furcate status``
starts from it); the first claim opens the sweep's parent run, and the record names it.
A job decided not to run (SKIP, REPORT_FAILURE) is not opened: see skipped_jobs.py.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence

from furcate_hydra import env_vars
from furcate_hydra.execution.job import Job
from furcate_hydra.launching.launcher_options import StoreOptions
from furcate_hydra.layout import JobPaths, SweepPaths
from furcate_hydra.store import (
    Action,
    Claim,
    ClaimRequest,
    CodeCheck,
    CodeVersion,
    Decision,
    RunRecord,
    RunStore,
    Tags,
    flatten_params,
)
from furcate_hydra.store.access import StoreAccess
from furcate_hydra.store.fingerprint import fingerprint
from furcate_hydra.store.sweep_pointer import SweepPointer

log = logging.getLogger(__name__)

__all__ = ["RunOpener", "sweep_run_name"]

# MLflow's SQL stores keep 250 characters of a run's name; job and sweep names stay below.
_MAX_RUN_NAME = 240


class RunOpener:
    """Decides each job, claims the configs to run and opens their runs; without a store
    (``access`` None) it still fingerprints and writes the sweep's pointer."""

    def __init__(
        self,
        options: StoreOptions,
        access: StoreAccess | None,
        sweep: SweepPaths,
        invocation: str,
        code: CodeVersion | None,
        where: Mapping[str, str],
    ) -> None:
        self.options = options
        self.access = access
        self.sweep = sweep
        self._invocation = invocation  # the command line's overrides, the sweep run's name
        self._code = code
        self._where = dict(where)  # tags of every run: where it ran (a Slurm job)
        self._code_check = CodeCheck(code.key if code else None, options.code_change)
        self._started_at: float | None = None  # when the sweep pointer was first written
        self._sweep_recorded = False
        self._claims: dict[str, Claim] = {}  # won, by job key, until the job's run is opened

    @property
    def store(self) -> RunStore | None:
        return self.access.store if self.access is not None else None

    def prepare(self, jobs: Sequence[Job]) -> list[Decision] | None:
        """Fingerprint a batch and ``decide`` it."""
        for job in jobs:
            job.fingerprint = fingerprint(job.task_config, self.options.fingerprint_ignore)
        return self.decide(jobs)

    def decide(self, jobs: Sequence[Job]) -> list[Decision] | None:
        """Decide each job of a prepared batch with one store lookup for all of them; None
        when only MLflow can read the store: open it, then decide again."""
        decisions: dict[str, Decision] = {}
        if self.access is not None:
            fingerprints = {str(j.fingerprint) for j in jobs}
            decided = self.access.decide(fingerprints, self.options.rerun, self._code_check)
            if decided is None:
                return None
            decisions = decided
        if self._started_at is None:
            self._write_sweep_pointer()
        run = Decision(Action.RUN)
        return [decisions.get(str(job.fingerprint), run) for job in jobs]

    def claim(self, jobs: Sequence[Job], decisions: Sequence[Decision]) -> list[Decision]:
        """Claim the configs of the jobs about to run or resume, one lookup for all of them.
        A lost claim turns its job's decision into ELSEWHERE: wait for the run that holds it.
        A config twice in the batch is claimed once; its twin waits for that run."""
        if self.store is None:
            return list(decisions)
        self._ensure_sweep_run()
        claiming = [Action.RUN, Action.RESUME]
        requests: list[ClaimRequest] = []
        owners: dict[str, str] = {}  # fingerprint → key of the job that claims it
        for job, decision in zip(jobs, decisions, strict=True):
            fp = str(job.fingerprint)
            if decision.action not in claiming or fp in owners:
                continue
            owners[fp] = job.key
            resumed = decision.record if decision.action is Action.RESUME else None
            checkpoints = (resumed.checkpoint_dir if resumed else None) or job.paths.checkpoint_dir
            requests.append(
                ClaimRequest(
                    fp,
                    (job.label or "defaults")[:_MAX_RUN_NAME],
                    {**self._job_tags(job), Tags.CHECKPOINT_DIR: str(checkpoints)},
                    {} if resumed else flatten_params(job.task_config),
                    resumed,
                )
            )
        claims = {c.request.fingerprint: c for c in self.store.claim(requests)}
        out: list[Decision] = []
        for job, decision in zip(jobs, decisions, strict=True):
            claim = claims.get(str(job.fingerprint))
            if decision.action not in claiming or claim is None:
                out.append(decision)
            elif claim.holder is not None:
                out.append(Decision(Action.ELSEWHERE, claim.holder, "claimed elsewhere first"))
            elif owners[claim.request.fingerprint] == job.key:
                self._claims[job.key] = claim
                out.append(decision)
            else:  # the same config again in this batch: it waits for the first one's run
                held = claim.request.resumes or claim.run
                out.append(Decision(Action.ELSEWHERE, held, "running in this sweep"))
        return out

    def follow(self, waiting: Sequence[RunRecord]) -> list[Decision | None]:
        """For runs held elsewhere: None while one still runs; else what to do with its job."""
        if self.store is None or not waiting:
            return [None] * len(waiting)
        return self.store.follow(waiting, self.options.rerun, self._code_check)

    def holder(self, record: RunRecord) -> str:
        """Which launcher holds a run, in words, for the log."""
        tags = record.tags
        if self.store is not None and self.store.identity.tags().items() <= tags.items():
            return f"this sweep's job #{tags.get(Tags.JOB_NUM, '?')}"
        pid, host = tags.get(Tags.LAUNCHER_PID, "?"), tags.get(Tags.HOST, "?")
        return f"launcher pid {pid} on {host}"

    def open_run(self, job: Job, decision: Decision) -> None:
        """Open the run of a job about to run (its claim's new run, or the interrupted one)
        and set its env: where it logs, where it writes and checkpoints."""
        if self.store is not None:
            claim = self._claims.pop(job.key)
            resumed = claim.request.resumes
            if resumed is not None and resumed.output_dir:
                # where the app's own checkpoints of the last attempt are
                job.env[env_vars.RESUMED_OUTPUT_DIR] = resumed.output_dir
            if resumed is not None and resumed.checkpoint_dir:
                # the run keeps its checkpoints where its first attempt wrote them; the new job
                # dir points there, so its checkpoints are found beside its other outputs
                job.paths = JobPaths.of(job.paths.output_dir, resumed.checkpoint_dir)
                _link_checkpoints(job.paths)
            job.run_id = self.store.confirm(claim)
            if resumed is not None:
                job.resumed = True
                log.info("\t#%d resumes MLflow run %s (%s)", job.num, job.run_id, decision.reason)
            job.env.update(
                {
                    env_vars.TRACKING_URI: self.store.tracking_uri,
                    env_vars.RUN_ID: job.run_id,
                    env_vars.EXPERIMENT_ID: self.store.experiment_id,
                }
            )
        job.env[env_vars.OUTPUT_DIR] = str(job.paths.output_dir)
        job.env[env_vars.CHECKPOINT_DIR] = str(job.paths.checkpoint_dir)

    def withdraw_claims(self) -> None:
        """Give up the claims of jobs that never started (the launcher stops)."""
        if self.store is not None:
            for claim in self._claims.values():
                self.store.withdraw(claim)
        self._claims.clear()

    def _job_tags(self, job: Job) -> dict[str, str]:
        return {
            Tags.FINGERPRINT: str(job.fingerprint),
            Tags.OVERRIDES: " ".join(job.overrides),
            Tags.JOB_NUM: str(job.num),
            Tags.OUTPUT_DIR: str(job.paths.output_dir),
            **(self._code.tags() if self._code is not None else {}),
            **self._where,
        }

    def _ensure_sweep_run(self) -> None:
        """The sweep's parent run, and the sweep dir's record naming it, once."""
        if self._sweep_recorded or self.store is None:
            return
        self._sweep_recorded = True
        self.store.start_sweep(
            sweep_run_name(time.time(), self._invocation),
            {
                Tags.SWEEP_DIR: str(self.sweep.sweep_dir),
                Tags.OVERRIDES: self._invocation,
                **self._where,
            },
        )
        self._write_sweep_pointer()

    def _write_sweep_pointer(self) -> None:
        """furcate_sweep.json: the store and experiment, and the sweep run once there is one."""
        if self._started_at is None:
            self._started_at = time.time()
        access, store = self.access, self.store
        SweepPointer(
            tracking_uri=access.tracking.uri if access else None,
            experiment_id=access.experiment_id if access else None,
            experiment_name=access.experiment if access else None,
            sweep_run_id=store.sweep_run_id if store else None,
            started_at=self._started_at,
            stale_after_s=self.options.stale_after_s,
        ).write(self.sweep.sweep_record)


def sweep_run_name(started: float, invocation: str) -> str:
    """The sweep's parent run name: what tells sweeps apart, first, as a narrow column cuts it.

    The local time it started (the UI shows the date beside it) and its command-line overrides,
    ``14:03:27 batch_size=32,64``; a sweep with none is ``14:03:27 sweep``.
    """
    clock = time.strftime("%H:%M:%S", time.localtime(started))
    return f"{clock} {invocation or 'sweep'}"[:_MAX_RUN_NAME]


def _link_checkpoints(paths: JobPaths) -> None:
    """``<job dir>/resume`` → the run's checkpoint dir, unless the job dir has its own."""
    link = paths.output_dir / JobPaths.CHECKPOINTS
    if link == paths.checkpoint_dir or os.path.lexists(link):
        return
    paths.output_dir.mkdir(parents=True, exist_ok=True)
    try:
        link.symlink_to(paths.checkpoint_dir, target_is_directory=True)
    except OSError as exc:  # a file system without links: the run's tag still says where
        log.warning("furcate: could not link %s to %s: %s", link, paths.checkpoint_dir, exc)
