"""The end-of-sweep summary: counts per outcome, one row per job that did not finish (with its
one-line reason and where its logs are; a pruned trial's says at which epoch), the return
values' extremes, and the highest memory any job's resource trace reached.

Only jobs that did not finish are kept, one short row each, so a sweep of a million jobs that
went well holds a handful of numbers here.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from numbers import Real

from furcate_hydra.monitor.render import duration_text

__all__ = ["SweepSummary", "Unfinished"]

# Outcomes in the order the summary lists them.
OUTCOMES = (
    "finished",
    "skipped",
    "pruned",
    "failed",
    "crashed",
    "killed",
    "preempted",
    "not started",
)


@dataclass(frozen=True)
class Unfinished:
    """A job that did not finish: its row in the summary."""

    num: int
    label: str
    # failed (raised, exited), crashed (a signal), killed, preempted (too often), not started,
    # pruned (its trial, by the sweeper)
    outcome: str
    reason: str
    logs: str


class SweepSummary:
    """Collects what the summary says, job by job, as jobs end."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.unfinished: list[Unfinished] = []
        self._lowest: tuple[float, int] | None = None
        self._highest: tuple[float, int] | None = None
        self.preemptions = 0  # of jobs queued again after a preemption, each time
        # the highest peak of the resource traces, and its job: resident memory, GPU memory
        self._rss_peak: tuple[float, int] | None = None
        self._gpu_peak: tuple[float, int] | None = None
        # jobs_per_gpu=auto: per GPU, jobs at a time and the peak per job learned
        self.gpu_lines: list[str] = []

    def finished(self, num: int, value: object, skipped: bool = False) -> None:
        self.counts["skipped" if skipped else "finished"] += 1
        if isinstance(value, Real) and not isinstance(value, bool):
            number = float(value)
            if math.isfinite(number):
                if self._lowest is None or number < self._lowest[0]:
                    self._lowest = (number, num)
                if self._highest is None or number > self._highest[0]:
                    self._highest = (number, num)

    def did_not_finish(self, row: Unfinished) -> None:
        self.counts[row.outcome] += 1
        self.unfinished.append(row)

    def preempted(self) -> None:
        """A job was preempted and queued again, to resume where it stopped."""
        self.preemptions += 1

    def pruned(self, count: int) -> None:
        """Trials the sweeper pruned: their jobs ended early but normally (among finished).
        No fewer than the pruned jobs named by ``pruned_job``."""
        named = sum(1 for row in self.unfinished if row.outcome == "pruned")
        self.counts["pruned"] = max(count, named)

    def pruned_job(self, row: Unfinished) -> None:
        """A job whose trial the sweeper pruned: a row of its own (it is counted among the
        finished, and in ``pruned``'s count)."""
        self.unfinished.append(row)
        self.pruned(self.counts["pruned"])

    def peaks(self, num: int, rss_mb: float | None, gpu_mem_mb: float | None) -> None:
        """A traced job's peaks: the summary names the highest of each over the sweep."""
        if rss_mb is not None and (self._rss_peak is None or rss_mb > self._rss_peak[0]):
            self._rss_peak = (rss_mb, num)
        if gpu_mem_mb is not None and (self._gpu_peak is None or gpu_mem_mb > self._gpu_peak[0]):
            self._gpu_peak = (gpu_mem_mb, num)

    @property
    def total(self) -> int:
        return sum(n for outcome, n in self.counts.items() if outcome != "pruned")

    def preemptions_line(self) -> str | None:
        if not self.preemptions:
            return None
        times = "1 preemption" if self.preemptions == 1 else f"{self.preemptions} preemptions"
        return f"{times}: each time the job was queued again and resumed from its checkpoint"

    def counts_line(self, elapsed_s: float | None = None) -> str:
        parts = [f"{self.counts[o]} {o}" for o in OUTCOMES if self.counts[o]]
        text = f"furcate: sweep of {self.total} jobs: " + (", ".join(parts) or "nothing ran")
        if elapsed_s is not None:
            text += f" in {duration_text(elapsed_s)}"
        return text

    def values_line(self, best: str | None) -> str | None:
        """The best result: the sweeper's when it has one, else the return values' range."""
        if best:
            return f"best: {best}"
        if self._lowest is None or self._highest is None:
            return None
        low, high = self._lowest, self._highest
        if low == high:
            return f"return value: {low[0]:.6g} (job #{low[1]})"
        return (
            f"return values: lowest {low[0]:.6g} (job #{low[1]}), "
            f"highest {high[0]:.6g} (job #{high[1]})"
        )

    def peaks_line(self) -> str | None:
        """The highest memory a job's trace reached, resident and on a GPU, with its job."""
        parts = []
        if self._rss_peak is not None:
            parts.append(f"{self._rss_peak[0]:,.0f} MiB resident (job #{self._rss_peak[1]})")
        if self._gpu_peak is not None:
            parts.append(f"{self._gpu_peak[0]:,.0f} MiB on its GPU (job #{self._gpu_peak[1]})")
        return "peak memory of a job: " + ", ".join(parts) if parts else None

    def text(self, elapsed_s: float | None = None, best: str | None = None) -> str:
        """What the console shows at the end of the sweep."""
        lines = [self.counts_line(elapsed_s)]
        for line in (self.values_line(best), self.peaks_line(), self.preemptions_line()):
            if line:
                lines.append(f"  {line}")
        lines += [f"  {line}" for line in self.gpu_lines]
        for row in self.unfinished:
            lines.append(f"  #{row.num} {row.outcome}: {row.reason}")
            lines.append(f"      {row.label or '(no overrides)'} | logs: {row.logs}")
        return "\n".join(lines)

    def markdown(self, elapsed_s: float | None = None, best: str | None = None) -> str:
        """The same summary as ``summary.md`` in the sweep dir."""
        lines = ["# Sweep summary", "", "| outcome | jobs |", "|---|---|"]
        lines += [f"| {o} | {self.counts[o]} |" for o in OUTCOMES if self.counts[o]]
        lines += ["", self.counts_line(elapsed_s)]
        for line in (self.values_line(best), self.peaks_line(), self.preemptions_line()):
            if line:
                lines += ["", line]
        if self.gpu_lines:
            lines += ["", "## GPU packing", ""]
            lines += [f"- {line}" for line in self.gpu_lines]
        if self.unfinished:
            lines += ["", "## Jobs that did not finish", ""]
            lines += ["| job | outcome | reason | overrides | logs |", "|---|---|---|---|---|"]
            for row in self.unfinished:
                cells = (f"#{row.num}", row.outcome, row.reason, row.label, row.logs)
                lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
