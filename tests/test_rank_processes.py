"""The command line Lightning's DDP ranks get in a furcate job: the app's primary config (its
``-cp``/``-cn``/``-cd`` in any form Hydra reads), this job's overrides, and none of the sweep.
``tests/test_ddp_jobs.py`` runs such ranks through the real CLI."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from furcate_hydra import env_vars
from furcate_hydra.hydra_api.private_names import get_args_parser
from furcate_hydra.job_process.rank_processes import launch_env, prepare_for_ranks

# the job's config, as far as its ranks' command line reads it
JOB = OmegaConf.create(
    {
        "hydra": {
            "overrides": {
                "task": ["lr=0.1"],
                "hydra": ["hydra.sweep.dir=sweep", "hydra/launcher=furcate"],
            },
            "runtime": {"output_dir": "sweep/0"},
        }
    }
)


def ranks_argv(app_argv: list[str], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What a rank's ``sys.argv[1:]`` is when the app was started with ``app_argv``: the
    launcher's env for its jobs, then the job's process made ready for its ranks."""
    monkeypatch.setattr(sys, "argv", [__file__, *app_argv])
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", None, raising=False)
    monkeypatch.delenv(env_vars.APP_CONFIG_FLAGS, raising=False)
    for name, value in launch_env().items():
        monkeypatch.setenv(name, value)
    HydraConfig.instance().cfg = None  # no run dir to set here
    prepare_for_ranks(JOB)
    assert sys.argv[0] == __file__
    return sys.argv[1:]


@pytest.mark.parametrize(
    ("app_argv", "flags"),
    [
        (["-m", "-cn", "wide", "lr=0.1,0.2"], ["--config-name=wide"]),
        (
            ["--config-name=wide", "--multirun", "-cp", "conf/other", "lr=0.1,0.2"],
            ["--config-path=conf/other", "--config-name=wide"],
        ),
        (
            ["-cd=more", "--config-path=/abs/conf", "-m", "-cn=wide", "lr=0.1,0.2"],
            ["--config-path=/abs/conf", "--config-name=wide", "--config-dir=more"],
        ),
        (  # Hydra reads abbreviations, so the ranks do
            ["lr=0.1,0.2", "--config-d", "more", "--config-n=wide", "-m"],
            ["--config-name=wide", "--config-dir=more"],
        ),
        (["-m", "-cn", "a b", "-cd", "more=x"], ["--config-name=a b", "--config-dir=more=x"]),
        (["-m", "lr=0.1,0.2"], []),
    ],
)
def test_the_ranks_get_the_apps_primary_config_and_this_jobs_overrides_alone(
    app_argv: list[str],
    flags: list[str],
    monkeypatch: pytest.MonkeyPatch,
    hydra_restore_singletons: Any,
) -> None:
    argv = ranks_argv(app_argv, monkeypatch)
    assert argv[: len(flags)] == flags
    assert argv[len(flags) :][:3] == ["lr=0.1", "hydra/launcher=furcate", "hydra.mode=RUN"]
    ranks, app = (get_args_parser().parse_args(args) for args in (argv, app_argv))
    assert (ranks.config_name, ranks.config_path, ranks.config_dir) == (
        app.config_name,
        app.config_path,
        app.config_dir,
    )
    assert not ranks.multirun and "lr=0.1,0.2" not in argv


def test_arguments_hydra_refuses_give_the_ranks_no_flags(
    monkeypatch: pytest.MonkeyPatch, hydra_restore_singletons: Any
) -> None:
    # the launcher called from other code than hydra.main (here: an ambiguous --config)
    monkeypatch.setattr(sys, "argv", [__file__, "--config", "x"])
    assert env_vars.APP_CONFIG_FLAGS not in launch_env()
    assert ranks_argv(["--config", "x"], monkeypatch)[0] == "lr=0.1"
