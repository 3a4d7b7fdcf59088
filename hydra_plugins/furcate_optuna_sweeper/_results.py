"""The study's outcome in the sweep dir: best params and value (or the Pareto set), and plots.

``optimization_results.yaml`` has hydra-optuna-sweeper's layout, so tools that read it keep
working: ``{name: optuna, best_params, best_value}``, or ``{name: optuna, solutions: [...]}``
with several directions. Plots are Optuna's own (matplotlib): optimization history and, once
enough trials completed, parameter importances.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import optuna
from omegaconf import OmegaConf
from optuna.trial import TrialState

from furcate_hydra.layout import SweepPaths

__all__ = ["RESULTS_FILE", "StudyResults", "write_results"]

log = logging.getLogger(__name__)

RESULTS_FILE = SweepPaths.OPTIMIZATION_RESULTS
HISTORY_PLOT = "optimization_history.png"
IMPORTANCE_PLOT = "param_importances.png"


class StudyResults:
    def __init__(self, summary: dict[str, Any], files: list[Path], tags: dict[str, str]) -> None:
        self.summary = summary
        self.files = files  # results file first, then the plots that could be drawn
        self.tags = tags  # for the sweep's MLflow run


def write_results(study: optuna.Study, sweep_dir: Path) -> StudyResults | None:
    """Write and log the results; None while no trial completed."""
    completed = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not completed:
        log.warning("furcate: study %r has no completed trial yet: no results", study.study_name)
        return None
    sweep_dir.mkdir(parents=True, exist_ok=True)
    tags: dict[str, str] = {"optuna.study_name": study.study_name}
    summary: dict[str, Any]
    if len(study.directions) == 1:
        best = study.best_trial
        summary = {"name": "optuna", "best_params": best.params, "best_value": best.value}
        log.info("Best parameters: %s", best.params)
        log.info("Best value: %s (trial %d)", best.value, best.number)
        tags.update({"optuna.best_value": str(best.value), "optuna.best_trial": str(best.number)})
    else:
        pareto = study.best_trials
        summary = {
            "name": "optuna",
            "solutions": [{"params": t.params, "values": t.values} for t in pareto],
        }
        log.info("Number of Pareto solutions: %d", len(pareto))
        for trial in pareto:
            log.info("    Values: %s, Params: %s", trial.values, trial.params)
        tags["optuna.pareto_trials"] = ",".join(str(t.number) for t in pareto)
    results = sweep_dir / RESULTS_FILE
    OmegaConf.save(OmegaConf.create(summary), results)
    files = [results, *_plots(study, sweep_dir)]
    return StudyResults(summary, files, tags)


def _plots(study: optuna.Study, sweep_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # no display in a sweep
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as optuna_plots

    made: list[Path] = []
    names = [f"objective {i}" for i in range(len(study.directions))]
    drawings: list[tuple[str, Any]] = []
    for i, name in enumerate(names):
        suffix = "" if len(names) == 1 else f"_{i}"
        target = None if len(names) == 1 else (lambda t, i=i: t.values[i])
        drawings.append(
            (
                HISTORY_PLOT.replace(".png", f"{suffix}.png"),
                lambda target=target, name=name: optuna_plots.plot_optimization_history(
                    study, target=target, target_name=name
                ),
            )
        )
        drawings.append(
            (
                IMPORTANCE_PLOT.replace(".png", f"{suffix}.png"),
                lambda target=target, name=name: optuna_plots.plot_param_importances(
                    study, target=target, target_name=name
                ),
            )
        )
    for filename, draw in drawings:
        path = sweep_dir / filename
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
                axes = draw()
            figure = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
            figure.savefig(path, dpi=100, bbox_inches="tight")
            plt.close(figure)
            made.append(path)
        except (ValueError, RuntimeError, ZeroDivisionError) as exc:
            # importances need >= 2 completed trials over some param that varied
            log.info("furcate: no %s: %s", filename, exc)
    return made
