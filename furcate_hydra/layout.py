"""Every on-disk name of a sweep and of its jobs, owned in one place.

    <sweep dir>/                    SweepPaths
      multirun.yaml                 the sweep's config, as Hydra's sweepers write it
      furcate_sweep.json            where the sweep records: store, experiment, sweep run
                                    (written at its start; ``furcate status`` reads it)
      run_data.csv                  one row per job (furcate's run_data.csv)
      summary.md                    counts per outcome, the jobs that did not finish and why
      gpu_packing.json              jobs_per_gpu=auto: per GPU, jobs at a time and the peak
                                    memory per job learned (``furcate status`` shows it)
      optimization_results.yaml     the Optuna sweeper's best trial(s), plus its plots
      optuna.db                     the study of an Optuna sweep with ``storage: null``
                                    (``optuna-2.db``, ... where the dir is reused)
      report/                       ``furcate report``: report.html and its figures as PNGs
      .mps/pipe/  .mps/log/         the MPS control daemon furcate started (hydra.launcher.mps):
                                    its sockets (unless that path is too long for a socket:
                                    then a short temporary dir) and its logs
      <job subdir>/                 JobPaths: Hydra's job dir (``.hydra/`` is Hydra's own)
        stdout.log  stderr.log      what the job's process printed
        run_data.json               what the launcher recorded of the job: written RUNNING
                                    when its process starts, again when it ends
        resume/                     furcate's epoch and step checkpoints and their verified
                                    pointer, last.json (damaged ones moved aside as
                                    *.corrupt); a resumed run keeps the directory its first
                                    attempt had (the new job dir links to it); an app's own
                                    ModelCheckpoint files stay where the app puts them
        history.json  plots/        the epoch history ``fit`` keeps, drawn per metric
        trace.csv                   the launcher's samples of the job's memory and CPU (and
                                    GPU), drawn in plots/resource_trace.png when it ends
        progress.json               where a running job's training is (``fit`` writes it)
        tracemalloc.txt             ``fit(tracemalloc_top=N)``: the top-N allocation growths
                                    of each epoch
        final.ckpt                  the last checkpoint, linked where it outlives pruning

The launcher, the slot pool, the job side (``JobEnv``) and anything reading a sweep later take
their paths from here, so a name changes in one line. MLflow artifact folders of a job's run
are ``plots/`` and ``checkpoints/`` (its final.ckpt).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["JobPaths", "SweepPaths"]

# furcate's own: the app's ModelCheckpoint often writes to <job dir>/checkpoints
CHECKPOINTS_DIR = "resume"
PLOTS_DIR = "plots"


@dataclass(frozen=True)
class JobPaths:
    """The files of one job.

    Attributes:
        output_dir: Hydra's job dir (absolute).
        checkpoint_dir: Where the job's run keeps its checkpoints; ``output_dir/resume``
            unless the run is a resumed one whose first attempt ran elsewhere.
    """

    output_dir: Path
    checkpoint_dir: Path

    STDOUT = "stdout.log"
    STDERR = "stderr.log"
    RUN_DATA = "run_data.json"
    HISTORY = "history.json"
    PROGRESS = "progress.json"
    TRACE = "trace.csv"
    TRACEMALLOC = "tracemalloc.txt"
    TRACE_PLOT = "resource_trace.png"
    FINAL_CHECKPOINT = "final.ckpt"
    CHECKPOINT_POINTER = "last.json"
    CHECKPOINTS = CHECKPOINTS_DIR
    PLOTS = PLOTS_DIR

    @classmethod
    def of(cls, output_dir: Path | str, checkpoint_dir: Path | str | None = None) -> JobPaths:
        """The paths of a job whose Hydra job dir is ``output_dir``."""
        output = Path(os.path.abspath(output_dir))
        checkpoints = Path(os.path.abspath(checkpoint_dir)) if checkpoint_dir else None
        return cls(output, checkpoints or output / CHECKPOINTS_DIR)

    @property
    def stdout(self) -> Path:
        return self.output_dir / self.STDOUT

    @property
    def stderr(self) -> Path:
        return self.output_dir / self.STDERR

    @property
    def run_data(self) -> Path:
        return self.output_dir / self.RUN_DATA

    @property
    def history(self) -> Path:
        return self.output_dir / self.HISTORY

    @property
    def progress(self) -> Path:
        return self.output_dir / self.PROGRESS

    @property
    def trace(self) -> Path:
        return self.output_dir / self.TRACE

    @property
    def tracemalloc(self) -> Path:
        return self.output_dir / self.TRACEMALLOC

    @property
    def trace_plot(self) -> Path:
        return self.plots_dir / self.TRACE_PLOT

    @property
    def plots_dir(self) -> Path:
        return self.output_dir / PLOTS_DIR

    @property
    def final_checkpoint(self) -> Path:
        return self.output_dir / self.FINAL_CHECKPOINT

    @property
    def checkpoint_pointer(self) -> Path:
        return self.checkpoint_dir / self.CHECKPOINT_POINTER

    @property
    def logs(self) -> Path:
        """Where a summary row points for the job's logs: its stderr once written, else its
        dir."""
        return self.stderr if self.stderr.exists() else self.output_dir

    def see_logs(self) -> str:
        """The sentence a failure message ends with, pointing at the job's output."""
        return f"See the job's logs: {self.stdout} and {self.stderr}"


@dataclass(frozen=True)
class SweepPaths:
    """The files of one sweep, beside its jobs' dirs."""

    sweep_dir: Path

    RUN_DATA_CSV = "run_data.csv"
    SUMMARY = "summary.md"
    GPU_PACKING = "gpu_packing.json"
    MULTIRUN_YAML = "multirun.yaml"
    SWEEP_RECORD = "furcate_sweep.json"
    OPTIMIZATION_RESULTS = "optimization_results.yaml"
    STUDY_DB = "optuna.db"
    REPORT_DIR = "report"
    REPORT_HTML = "report.html"
    MPS_DIR = ".mps"

    @classmethod
    def of(cls, sweep_dir: Path | str) -> SweepPaths:
        return cls(Path(os.path.abspath(sweep_dir)))

    @property
    def run_data_csv(self) -> Path:
        return self.sweep_dir / self.RUN_DATA_CSV

    @property
    def summary(self) -> Path:
        return self.sweep_dir / self.SUMMARY

    @property
    def gpu_packing(self) -> Path:
        return self.sweep_dir / self.GPU_PACKING

    @property
    def multirun_yaml(self) -> Path:
        return self.sweep_dir / self.MULTIRUN_YAML

    @property
    def sweep_record(self) -> Path:
        return self.sweep_dir / self.SWEEP_RECORD

    @property
    def optimization_results(self) -> Path:
        return self.sweep_dir / self.OPTIMIZATION_RESULTS

    @property
    def report_dir(self) -> Path:
        return self.sweep_dir / self.REPORT_DIR

    @property
    def report_html(self) -> Path:
        return self.report_dir / self.REPORT_HTML

    @property
    def mps_pipe_dir(self) -> Path:
        return self.sweep_dir / self.MPS_DIR / "pipe"

    @property
    def mps_log_dir(self) -> Path:
        return self.sweep_dir / self.MPS_DIR / "log"

    def new_study_db(self) -> Path:
        """A sqlite file no earlier sweep wrote, for a study of this sweep only (``storage:
        null``). A reused sweep dir keeps its earlier studies: the next free name is taken."""
        path = self.sweep_dir / self.STUDY_DB
        number = 1
        while path.exists():
            number += 1
            path = self.sweep_dir / f"{Path(self.STUDY_DB).stem}-{number}.db"
        return path
