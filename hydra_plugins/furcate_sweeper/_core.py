"""Run a grid sweep: plan the grid, then stream it onto the launcher's slots (or launch batches).

params + command line ──► grid ──► exclusion rules on composed configs ──► SweepQueue
                           (job dirs outside the sweep dir, rules of the wrong type: refused;
                            rules matching no config: a warning)
furcate launcher: a SlotFeed (launching/slot_feed.py) takes the queue's jobs, one per free slot,
                  then one more per slot ahead (forked and set up while the slots are busy)
                  ──► wait_any ──► the next job is already there
any other launcher: launch() a batch, wait for all of it, next batch
between waits: primary config file edited? ──► new grid ──► queue gains / drops configs
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext
from omegaconf import DictConfig, OmegaConf

from furcate_hydra.errors import first_line
from furcate_hydra.hydra_api.options import OptionError
from furcate_hydra.launching.slot_feed import FeedPace, JobSource, SlotFeed
from furcate_hydra.launching.streaming import JobRequest, StreamingLauncher, as_streaming
from furcate_hydra.sweepers.exclusion_filter import FilteredGrid, GridFilter
from furcate_hydra.sweepers.grid import COMPOSE_ERRORS, SweepSpec, expand_grid
from furcate_hydra.sweepers.sweep_returns import ReturnBatch, SweepReturns
from furcate_hydra.sweepers.sweeper_base import SweepContext, save_multirun_config
from furcate_hydra.sweeping.sweep_queue import SweepQueue
from hydra_plugins.furcate_sweeper._live import LiveConfig, primary_config_file

__all__ = ["GridPlanner", "SweepOptions", "run_grid_sweep"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepOptions:
    spec: SweepSpec
    max_batch_size: int | None
    watch: bool
    watch_interval_s: float

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> SweepOptions:
        """``hydra.sweeper`` with every key set (``with_defaults``)."""
        spec = SweepSpec.parse(options["params"], options["exclude"])
        size = options["max_batch_size"]
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise OptionError(
                "hydra.sweeper.max_batch_size",
                size,
                "must be a positive number of jobs, or null for all at once",
                "set hydra.sweeper.max_batch_size=null (or e.g. 8)",
            )
        interval = options["watch_interval_s"]
        if isinstance(interval, bool) or not isinstance(interval, int | float) or interval <= 0:
            raise OptionError(
                "hydra.sweeper.watch_interval_s",
                interval,
                "must be a positive number of seconds",
                "set hydra.sweeper.watch_interval_s=1.0, or hydra.sweeper.watch=false",
            )
        return cls(spec, size, bool(options["watch"]), float(interval))


# A grid this big takes noticeable seconds to check before its first job: said first.
_SAY_FROM_CONFIGS = 5_000


class GridPlanner:
    """The configs a spec makes, less the excluded ones; composes through one GridFilter."""

    def __init__(
        self, hydra_context: HydraContext, config: DictConfig, arguments: Sequence[str]
    ) -> None:
        self.arguments = list(arguments)
        self._parser = OverridesParser.create(config_loader=hydra_context.config_loader)
        self.filter = GridFilter(hydra_context, config)
        self._said = False

    def plan(self, spec: SweepSpec) -> FilteredGrid:
        grid = expand_grid(spec, self.arguments, self._parser)
        if len(grid) >= _SAY_FROM_CONFIGS and not self._said:
            self._said = True
            log.info(
                "furcate: composing each of the grid's %d configs once, to check it before the "
                "first job starts (a few ms each)",
                len(grid),
            )
        return self.filter.apply(grid, spec.rules)


# A job of the grid: its overrides and its ``hydra.job.num``.
NumberedJob = tuple[list[str], int]


class GridSweep:
    """One sweep's state: the queue, job numbers, returns (on disk), and the live config file."""

    def __init__(self, options: SweepOptions, planner: GridPlanner, context: SweepContext) -> None:
        self.options = options
        self.planner = planner
        self.launcher = context.launcher
        hydra_context, config = context.hydra_context, context.config
        grid = planner.plan(options.spec)
        log.info("furcate: %s", grid.describe())
        for warning in grid.warnings():
            log.warning("furcate: %s", warning)
        self.queue = SweepQueue(grid.kept)
        self.returns = SweepReturns()
        self.next_num = 0
        self.config = config
        self.loader = hydra_context.config_loader
        # Set when the config files stopped composing mid-sweep (an edit left them broken):
        # no new job starts until an edit makes them compose again.
        self.on_hold = False
        self.files_changed = False
        self.live: LiveConfig | None = None
        path = primary_config_file(config) if options.watch else None
        if path is not None:
            self.live = LiveConfig(hydra_context, config, path)
            log.info("furcate: watching %s for edits of hydra.sweeper.params/exclude", path)

    def numbered(self, configs: Sequence[tuple[str, ...]]) -> list[NumberedJob]:
        jobs = [(list(config), self.next_num + i) for i, config in enumerate(configs)]
        self.next_num += len(jobs)
        return jobs

    def hold(self, jobs: Sequence[NumberedJob], error: BaseException) -> None:
        """Jobs that no longer compose go back to the queue, their numbers unused, until an
        edit fixes the files; without a watched file the error ends the sweep, as in Hydra."""
        if self.live is None:
            raise error
        self.queue.put_back([tuple(overrides) for overrides, _ in jobs])
        self.next_num = jobs[0][1]
        self.on_hold = True
        log.error(
            "furcate: job #%d (%s) does not compose from the config files as they are now: "
            "%s. No new job starts until %s is fixed; running jobs go on.",
            jobs[0][1],
            " ".join(jobs[0][0]) or "no overrides",
            first_line(error),
            self.live.path,
        )

    def composes(self, jobs: Sequence[NumberedJob]) -> bool:
        """For launchers that compose each job from the files: check first, once they changed."""
        if not self.files_changed:
            return True  # the planner composed every config of the grid from these files
        try:
            for overrides, _ in jobs:
                self.loader.load_sweep_config(self.config, list(overrides))
        except COMPOSE_ERRORS as exc:
            self.hold(jobs, exc)
            return False
        return True

    def follow_edits(self) -> None:
        """Apply an edit of the primary config file; report and ignore one that is invalid."""
        if self.live is None or not self.live.changed():
            return
        self.files_changed = True
        try:
            edited = self.live.reload()
            # Composed by Hydra from the plugin's dataclass: every key is there.
            options = SweepOptions.parse(_sweeper_options(edited))
            self.planner.filter.forget()
            grid = self.planner.plan(options.spec)
        except Exception as exc:
            log.error(
                "furcate: ignoring the edit of %s, the sweep goes on with the grid it had: %s",
                self.live.path,
                exc,
            )
            return
        if self.live.task_values_changed(edited):
            log.info(
                "furcate: %s changed config values; jobs started from now on use them",
                self.live.path,
            )
        if (streaming := as_streaming(self.launcher)) is not None:
            streaming.config_files_changed()
        self.on_hold = False
        change = self.queue.replace_grid(grid.kept)
        log.info(
            "furcate: %s edited: %s; %d new configs queued, %d queued configs dropped, "
            "%d already started or finished; %d waiting",
            self.live.path,
            grid.describe(),
            len(change.added),
            len(change.dropped),
            change.already_taken,
            len(self.queue),
        )
        for warning in grid.warnings():
            log.warning("furcate: %s", warning)


def run_grid_sweep(
    options: SweepOptions, context: SweepContext, arguments: Sequence[str]
) -> list[ReturnBatch]:
    """Run every config of the grid once; returns in job order, grouped in batches."""
    planner = GridPlanner(context.hydra_context, context.config, arguments)
    sweep = GridSweep(options, planner, context)
    save_multirun_config(context.config)
    if (streaming := as_streaming(context.launcher)) is not None:
        _stream(sweep, streaming)
    else:
        _batches(sweep, context.launcher, options.max_batch_size)
    _raise_first_failure(sweep.returns)
    return sweep.returns.batches(options.max_batch_size)


def _stream(sweep: GridSweep, launcher: StreamingLauncher) -> None:
    """Keep every slot busy: each slot has its next job submitted (ahead) while its job runs,
    so the launcher starts it the moment the slot frees."""
    if not len(sweep.queue):
        return  # nothing to run: no pool to start
    with launcher.streaming():
        # a job whose config another launcher runs waits without a slot: launchers sweeping
        # one grid share it instead of waiting for each other
        pace = FeedPace(
            launcher.slot_count,
            launcher.jobs_ahead,
            elsewhere_holds_room=False,
            grow_on_skips=True,
            # fused groups of a learned width: as many jobs as its open seats hold
            follow_open_slots=True,
        )
        SlotFeed(launcher, _GridFeed(sweep, launcher), pace).run()


class _GridFeed(JobSource[NumberedJob]):
    """The queue as a slot feed's source: each job its overrides and number; between rounds,
    edits of the config file followed."""

    def __init__(self, sweep: GridSweep, launcher: StreamingLauncher) -> None:
        self.sweep = sweep
        self.launcher = launcher
        self.wake_every_s = sweep.options.watch_interval_s if sweep.live is not None else None

    def has_more(self) -> bool:
        return len(self.sweep.queue) > 0

    def ready(self) -> bool:
        return not self.sweep.on_hold

    def take(self, count: int) -> list[tuple[JobRequest, NumberedJob]]:
        jobs = self.sweep.numbered(self.sweep.queue.take(count))
        return [(JobRequest(overrides, num), (overrides, num)) for overrides, num in jobs]

    def refused(self, items: Sequence[NumberedJob], error: Exception) -> bool:
        if not isinstance(error, COMPOSE_ERRORS):
            return False
        self.sweep.hold(items, error)  # the files were edited into a broken state
        return True

    def wait_until_ready(self) -> None:
        time.sleep(self.sweep.options.watch_interval_s)  # on hold: wait for the fixing edit

    def ended(self, item: NumberedJob, key: str, job_return: JobReturn) -> None:
        self.sweep.returns.add(item[1], job_return)

    def round_done(self) -> None:
        self.sweep.follow_edits()
        self.launcher.sweep_status(to_come=len(self.sweep.queue))


def _batches(sweep: GridSweep, launcher: Launcher, max_batch_size: int | None) -> None:
    """Hydra's way, for launchers that cannot stream: a batch, all of it, the next batch."""
    while len(sweep.queue):
        if sweep.on_hold:
            time.sleep(sweep.options.watch_interval_s)
            sweep.follow_edits()
            continue
        jobs = sweep.numbered(sweep.queue.take(max_batch_size or len(sweep.queue)))
        if not sweep.composes(jobs):
            continue
        tic = time.perf_counter()
        results = launcher.launch([overrides for overrides, _ in jobs], jobs[0][1])
        log.debug("furcate: batch of %d took %.1f s", len(jobs), time.perf_counter() - tic)
        for (_, num), job_return in zip(jobs, results, strict=True):
            sweep.returns.add(num, job_return)
        sweep.follow_edits()


def _raise_first_failure(returns: SweepReturns) -> None:
    """Like Hydra's sweepers, end with the first failed job's error; but only after every
    other config has run, so one bad config does not cost the rest of the sweep."""
    first = returns.first_failure()
    if first is None:
        return
    named = returns.failures_named()
    names = ", ".join(named)
    more = f" and {returns.failed - len(named)} more" if returns.failed > len(named) else ""
    log.error("furcate: %d of %d jobs failed: %s%s", returns.failed, len(returns), names, more)
    _ = first.return_value  # raises the job's own exception


def _sweeper_options(config: DictConfig) -> dict[str, Any]:
    node = OmegaConf.select(config, "hydra.sweeper")
    return {str(k): node[k] for k in node} if node is not None else {}
