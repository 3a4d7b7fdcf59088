"""What a launch session shows: the progress view, its tally, and the sweep's summary.

scheduler's results ──► counted (SweepTally: the live view's numbers)
                    ──► a row each in the summary (SweepSummary): finished, skipped, or why not
                        (one line, with where its logs are), said at once for a failure
stream's end ──► the summary on the console and as summary.md in the sweep dir
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from hydra.core.utils import JobReturn, JobStatus

from furcate_hydra.atomic import atomic_write_bytes
from furcate_hydra.execution.gpu.packing import GpuPacking
from furcate_hydra.execution.job import Job
from furcate_hydra.launching.launcher_options import ProgressOptions
from furcate_hydra.launching.requested_jobs import task_overrides
from furcate_hydra.layout import JobPaths, SweepPaths
from furcate_hydra.monitor.summary import SweepSummary, Unfinished
from furcate_hydra.monitor.tally import SweepTally
from furcate_hydra.monitor.views import make_view
from furcate_hydra.reasons import one_line_reason, pruned_reason
from furcate_hydra.records.job_returns import error_text, how_it_ended
from furcate_hydra.store.gpu_packing_file import write_packing
from furcate_hydra.store.run_data import JobRow
from furcate_hydra.tracing import TracePeaks

if TYPE_CHECKING:
    from furcate_hydra.scheduling import StreamCounts
    from furcate_hydra.store import CodeVersion

log = logging.getLogger(__name__)

__all__ = ["SessionView", "log_interrupted", "log_stream_counts"]


class SessionView:
    """The tally, the live view over it, and the summary of a session's jobs."""

    def __init__(self, options: ProgressOptions, slots: int, summary_file: Path) -> None:
        self.tally = SweepTally(slots)
        self.view = make_view(options.mode, self.tally, options.every_s)
        self.summary = SweepSummary()
        self._summary_file = summary_file
        self._packing_shown: dict[str, dict[str, float | int | str]] | None = None
        self._on = False

    def start(self) -> None:
        """Show the progress view (after the fork: a fork copies no other thread)."""
        if not self._on:
            self._on = True
            self.view.start()

    def stop(self) -> None:
        if self._on:
            self._on = False
            self.view.stop()

    def not_run(self, job: Job, result: JobReturn) -> str | None:
        """A job skipped, or its recorded failure reported (rerun=none): how it ended, None
        when it had finished."""
        self.tally.skipped()
        if result.status is JobStatus.COMPLETED:
            self.summary.finished(job.num, result.return_value, skipped=True)
            return None
        return self.did_not_finish(job, result)

    def finished(self, job: Job, job_return: JobReturn, peaks: TracePeaks | None) -> str | None:
        """A job handed back: how it ended, None when it completed."""
        if peaks is not None:
            self.summary.peaks(job.num, peaks.rss_mb, peaks.gpu_mem_mb)
        ok = job_return.status is JobStatus.COMPLETED
        self.tally.finished(ok)
        if ok:
            self.summary.finished(job.num, job_return.return_value)
            return None
        return self.did_not_finish(job, job_return)

    def did_not_finish(self, job: Job, job_return: JobReturn) -> str:
        """Say why at once (a job never started goes without saying) and keep its row;
        returns how it ended (``how_it_ended``)."""
        text = error_text(job, job_return)
        how = how_it_ended(job, text)
        reason = one_line_reason(text) or how
        logs = job.paths.logs
        self.summary.did_not_finish(Unfinished(job.num, job.label, how, reason, str(logs)))
        if how != "not started":
            log.warning("furcate: job #%d %s: %s (logs: %s)", job.num, how, reason, logs)
        return how

    def stopped(self, held: list[Job]) -> None:
        """Jobs in flight when the launcher stopped."""
        for job in held:
            started = job.started_at is not None
            self.summary.did_not_finish(
                Unfinished(
                    job.num,
                    job.label,
                    "killed" if started else "not started",
                    "launcher stopped",
                    str(job.paths.logs),
                )
            )

    def pruned(self, row: JobRow, epoch: int | None) -> None:
        """A handed-back job whose trial the sweeper pruned at ``epoch``."""
        label = " ".join(task_overrides(row.overrides))
        logs = str(JobPaths.of(row.output_dir).logs)
        self.summary.pruned_job(
            Unfinished(row.job_num, label, "pruned", pruned_reason(epoch), logs)
        )

    def show_packing(self, packing: GpuPacking) -> None:
        """``jobs_per_gpu=auto``: what it learned so far, in gpu_packing.json (``furcate
        status``) and in the summary; called on every job event, it writes only what changed."""
        gpus = packing.snapshot()
        if gpus == self._packing_shown:
            return
        self.summary.gpu_lines = packing.lines()
        self.tally.slots_open(packing.open_slots())
        path = self._summary_file.with_name(SweepPaths.GPU_PACKING)
        try:
            write_packing(path, gpus, self.summary.gpu_lines)
            self._packing_shown = gpus  # a failed write is tried again at the next event
        except OSError as exc:
            log.warning("furcate: could not write %s: %s", path, exc)

    def write_summary(self, console: bool = True) -> None:
        """The summary: on the console, and as summary.md in the sweep dir."""
        snap = self.tally.snapshot()
        if console:
            log.info(self.summary.text(snap.elapsed_s, snap.best))
        text = self.summary.markdown(snap.elapsed_s, snap.best).encode()
        atomic_write_bytes(self._summary_file, text, durable=False)


def log_stream_counts(counts: StreamCounts, code: CodeVersion | None) -> None:
    """The closing lines of a stream: what ran elsewhere, what was skipped, and why."""
    if counts.ran_elsewhere:
        log.info(
            "furcate: %d of %d configs ran in other launchers (their MLflow runs are the record)",
            counts.ran_elsewhere,
            counts.submitted,
        )
    if counts.skipped:
        log.info(
            "furcate: skipped %d of %d configs already recorded in MLflow",
            counts.skipped,
            counts.submitted,
        )
    if counts.skipped_other_code:
        log.warning(
            "furcate: %d of the %d skipped configs were finished by other code than this "
            "sweep's (%s); set hydra.launcher.code_change=rerun to run them again",
            counts.skipped_other_code,
            counts.skipped,
            code.key if code is not None else "unknown",
        )


def log_interrupted(signum: int, stopped: int, sweep_dir: object) -> None:
    """What a Ctrl-C or SIGTERM stopped, and how to resume."""
    log.warning(
        "furcate: interrupted (%s): %d job%s stopped and recorded as KILLED, the "
        "sweep's records written to %s; run the same command to resume",
        signal.Signals(signum).name,
        stopped,
        "" if stopped == 1 else "s",
        sweep_dir,
    )
