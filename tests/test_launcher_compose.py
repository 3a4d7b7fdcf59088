"""The launcher's composition shortcut gives exactly Hydra's ``load_sweep_config`` result."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hydra._internal.callbacks import Callbacks
from hydra._internal.hydra import Hydra
from hydra._internal.utils import create_config_search_path
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException
from hydra.types import HydraContext, RunMode
from omegaconf import OmegaConf

from furcate_hydra.launching.compose import SweepComposer
from tests.conftest import APPS


@pytest.fixture
def composer(tmp_path: Path, hydra_restore_singletons: Any) -> Iterator[SweepComposer]:
    GlobalHydra.instance().clear()
    hydra = Hydra.create_main_hydra2(
        task_name="probe_app", config_search_path=create_config_search_path(str(APPS / "conf"))
    )
    master = hydra.compose_config(
        "probe",
        [f"hydra.sweep.dir={tmp_path}", "+model=small", "sleep=0.5"],
        run_mode=RunMode.MULTIRUN,
        with_log_configuration=False,
    )
    context = HydraContext(config_loader=hydra.config_loader, callbacks=Callbacks(master))
    yield SweepComposer(context, master)
    GlobalHydra.instance().clear()


JOBS = [
    ["+model=small", "sleep=0.5", "mode=ok", "+lr=0.1"],
    ["+model=small", "sleep=0.5", "mode=raise", "+lr=0.01"],  # same shape: the shortcut
    ["+model=small", "sleep=1.5", "mode=ok", "+lr=0.001"],
    ["+model=small", "sleep=0.5", "++model.width=16", "~mode"],
    ["+model=small", "sleep=0.5", "++model.width=32", "~mode"],
    ["+model=big", "sleep=0.5", "mode=ok", "+lr=0.1"],  # another group choice: a new base
    ["+model=big", "sleep=0.5", "mode=ok", "+lr=0.2"],
    ["+model=small", "sleep=0.5", "+lr=[1,2]", "+opt={name:sgd,momentum:0.9}"],
    ["+model=small", "sleep=0.5", "+lr=[3,4]", "+opt={name:adam,momentum:0.0}"],
    ["+model=small", "hydra.job.chdir=true", "sleep=0.5"],  # hydra.*: always Hydra
    ["+model=small", "hydra.job.chdir=true", "sleep=0.7"],
]


def test_shortcut_and_hydra_compose_the_same_configs(composer: SweepComposer) -> None:
    for overrides in JOBS:
        ours = composer.compose(overrides)
        hydras = composer.loader.load_sweep_config(composer.master, overrides)
        assert OmegaConf.to_container(ours) == OmegaConf.to_container(hydras), overrides
        assert ours.hydra.job.override_dirname == hydras.hydra.job.override_dirname
    # Every job of a shape after its first (verified against Hydra): jobs 1, 2, 4, 6 and 8.
    # hydra.* overrides (9, 10) never take the shortcut.
    assert composer.shortcuts == 5


def test_composed_configs_do_not_share_state(composer: SweepComposer) -> None:
    first = composer.compose(["+model=small", "sleep=0.5", "+lr=0.1"])
    second = composer.compose(["+model=small", "sleep=0.5", "+lr=0.2"])
    third = composer.compose(["+model=small", "sleep=0.5", "+lr=0.3"])
    assert composer.shortcuts == 2
    third.lr = 99.0
    assert (first.lr, second.lr) == (0.1, 0.2)
    assert composer.compose(["+model=small", "sleep=0.5", "+lr=0.4"]).lr == 0.4


def test_bad_override_gets_hydras_error(composer: SweepComposer) -> None:
    composer.compose(["+model=small", "sleep=0.5", "+lr=0.1"])
    composer.compose(["+model=small", "sleep=0.5", "+lr=0.2"])
    with pytest.raises(ConfigCompositionException, match="Could not append to config"):
        composer.compose(["+model=small", "+sleep=0.5"])
    with pytest.raises(ConfigCompositionException, match="Could not override 'nope'"):
        composer.compose(["+model=small", "nope=1"])
