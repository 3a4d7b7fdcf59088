"""Where a job writes, refused before it runs when that is outside the sweep dir.

Values end up in paths: a job's dir is ``<hydra.sweep.dir>/<hydra.sweep.subdir>``, its Hydra
files go to ``<job dir>/<hydra.output_subdir>``, its log to ``<job dir>/<hydra.job.name>.log``,
and the job name also names the MLflow experiment. A value typed on the command line, an
interpolation or an override's value (``${hydra.job.override_dirname}``) can put any of them
anywhere: ``hydra.job.name=../../x`` writes the log two levels above the job dir.

The check reads the path text, ``..`` collapsed, not the file system: a symlink inside the
sweep dir is followed (someone made it on purpose, say to put job dirs on a bigger disk), and
an absolute subdir is outside only when it names a place outside the sweep dir
(``${hydra.sweep.dir}/${hydra.job.num}`` is inside). A job name is never a path: one with a
``/`` is refused wherever it points, since its log would go to a folder nobody creates.
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from furcate_hydra.hydra_api.options import OptionError

__all__ = ["check_job_name", "check_job_paths", "job_output_dir"]

_NAME_FIX = (
    "set hydra.job.name to a plain name such as {example}, or leave it to Hydra (the app's "
    "file name); the MLflow experiment can be named apart with "
    "hydra.launcher.mlflow.experiment_name"
)
_DIR_FIXES = {
    "hydra.sweep.subdir": (
        "give a subdir inside the sweep dir, such as ${hydra.job.num} or "
        "runs/${hydra.job.override_dirname}; to put the jobs elsewhere, set hydra.sweep.dir "
        "there, or link a folder of the sweep dir there (a symlink is followed)"
    ),
    "hydra.sweep.dir": "set hydra.sweep.dir once for the whole sweep, not per job",
}


def job_output_dir(sweep_config: DictConfig) -> str:
    """The job's dir, by the rule Hydra's ``run_job`` applies in the job, evaluated in the
    launcher so the executor knows where the job's logs go even if the job dies before Hydra
    creates its dir. Call inside ``as_job(sweep_config)``, with the job's number set."""
    sweep_dir = str(OmegaConf.select(sweep_config, "hydra.sweep.dir"))
    subdir = str(OmegaConf.select(sweep_config, "hydra.sweep.subdir"))
    return os.path.join(sweep_dir, subdir)


def check_job_name(config: DictConfig) -> None:
    """Refuse a ``hydra.job.name`` that is a path, before the store or any job uses it."""
    name = str(OmegaConf.select(config, "hydra.job.name"))
    if "/" in name or os.sep in name:
        raise _name_error(config, name, "the log of each job would be <job dir>/{name}.log")


def check_job_paths(sweep_config: DictConfig, sweep_dir: str | Path, job: str) -> None:
    """Raise an OptionError naming the key, its value, where it puts ``job``'s files and the
    fix, if the job's dir, Hydra files or log lie outside ``sweep_dir`` (the sweep's, which
    the job's own config may have changed). Call inside ``as_job(sweep_config)``."""
    sweep = os.path.abspath(sweep_dir)
    job_dir = os.path.abspath(job_output_dir(sweep_config))
    name = str(OmegaConf.select(sweep_config, "hydra.job.name"))
    if "/" in name or os.sep in name:
        log = os.path.abspath(os.path.join(job_dir, f"{name}.log"))
        inside = _inside(log, sweep)
        place = "in a folder nobody creates" if inside else f"outside the sweep dir {sweep}"
        raise _name_error(sweep_config, name, f"the log of {job} would be {log}, {place}")
    if not _inside(job_dir, sweep):
        own_sweep = os.path.abspath(str(OmegaConf.select(sweep_config, "hydra.sweep.dir")))
        key = "hydra.sweep.subdir" if _inside(own_sweep, sweep) else "hydra.sweep.dir"
        raise OptionError(
            key,
            _written(sweep_config, key),
            f"{_resolved(sweep_config, key)}puts the dir of {job} at {job_dir}, outside the "
            f"sweep dir {sweep}",
            _DIR_FIXES[key],
        )
    output_subdir = OmegaConf.select(sweep_config, "hydra.output_subdir")
    if output_subdir is not None:
        hydra_dir = os.path.abspath(os.path.join(job_dir, str(output_subdir)))
        if not _inside(hydra_dir, sweep):
            key = "hydra.output_subdir"
            raise OptionError(
                key,
                _written(sweep_config, key),
                f"{_resolved(sweep_config, key)}puts the Hydra files of {job} at {hydra_dir}, "
                f"outside the sweep dir {sweep}",
                "leave it at .hydra (a folder in the job dir), or null for no such files",
            )


def _name_error(config: DictConfig, name: str, where: str) -> OptionError:
    example = os.path.basename(name.rstrip("/")) or "train"
    return OptionError(
        "hydra.job.name",
        _written(config, "hydra.job.name"),
        f"{_resolved(config, 'hydra.job.name')}names each job's log file (<job dir>/<name>.log) "
        f"and the MLflow experiment, so it cannot contain '/': " + where.format(name=name),
        _NAME_FIX.format(example=example),
    )


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _written(config: DictConfig, key: str) -> str:
    """The value as the config has it, interpolations unresolved."""
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(config, parent_key)
    node = parent._get_node(leaf) if isinstance(parent, DictConfig) else None
    return str(node._value()) if node is not None else str(OmegaConf.select(config, key))


def _resolved(config: DictConfig, key: str) -> str:
    """``resolves to '…' and `` where the written value is an interpolation."""
    written, value = _written(config, key), str(OmegaConf.select(config, key))
    return f"resolves to {value!r} and " if written != value else ""
