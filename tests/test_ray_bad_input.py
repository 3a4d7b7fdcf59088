"""Bad ``hydra.launcher.backend`` / ``hydra.launcher.ray`` input: refused before anything
starts, naming the key, the bad value and the fix. Checked in this process (no Ray cluster is
needed: each refusal comes before Ray is joined), plus one real CLI run."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.execution.slots import plan_slots
from furcate_hydra.launching.backends import plan_for
from furcate_hydra.ray_backend.cluster import plan_ray_slots
from furcate_hydra.ray_backend.options import RayOptions
from hydra_plugins.furcate_launcher.config import FurcateLauncherConf
from tests.conftest import run_probe_sweep
from tests.option_helpers import parse_launcher_options
from tests.ray_cluster import RAY_MISSING
from tests.test_slots import GIB, FakeProbe
from tests.test_store_server import free_port


def check(options: dict[str, Any]) -> None:
    """What the launcher does with ``hydra.launcher`` before any job: parse, then plan."""
    merged: Any = OmegaConf.to_container(
        OmegaConf.merge(OmegaConf.structured(FurcateLauncherConf), options)
    )
    plan_for(parse_launcher_options(merged))


def refused(options: dict[str, Any]) -> str:
    with pytest.raises(FurcateConfigError) as raised:
        check(options)
    message = str(raised.value)
    assert "Fix:" in message, message
    return message


def test_an_unknown_backend_is_named_with_the_allowed_ones() -> None:
    message = refused({"backend": "kubernetes"})
    assert "Invalid hydra.launcher.backend='kubernetes'" in message
    assert "local, ray, slurm" in message


# Slot options that the local backend refuses: refused alike with backend=ray, before Ray is
# imported or joined (the options check themselves, whatever the backend).
RAY_BAD_SLOT_OPTIONS: list[tuple[dict[str, Any], str, object, str]] = [
    ({"jobs_per_gpu": 0}, "jobs_per_gpu", 0, "set it to 1 or more"),
    ({"jobs_per_gpu": -2}, "jobs_per_gpu", -2, "set it to 1 or more"),
    ({"jobs_per_gpu": 2, "gpu_mem_per_job_gb": 4.0}, "jobs_per_gpu", 2, "pick one"),
    ({"gpu_mem_per_job_gb": -1.0}, "gpu_mem_per_job_gb", -1.0, "the GPU memory one job needs"),
    ({"max_jobs_per_gpu": 0}, "max_jobs_per_gpu", 0, "set it to 1 or more"),
    ({"max_workers": 0}, "max_workers", 0, "set it to 1 or more"),
    ({"cpus_per_job": 0}, "cpus_per_job", 0, "set it to 1 or more"),
    ({"allow_cpu": "yes"}, "allow_cpu", "yes", "allow_cpu=true or false"),
    ({"gpus_per_job": 0}, "gpus_per_job", 0, "the GPUs one job trains on"),
    ({"gpus_per_job": 2, "jobs_per_gpu": 2}, "gpus_per_job", 2, "jobs_per_gpu=null"),
]


@pytest.mark.parametrize(("options", "key", "value", "fix"), RAY_BAD_SLOT_OPTIONS)
def test_bad_slot_options_are_refused_with_the_ray_backend_too(
    monkeypatch: pytest.MonkeyPatch, options: dict[str, Any], key: str, value: object, fix: str
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # refused before Ray is needed at all
    with pytest.raises(FurcateConfigError) as raised:
        parse_launcher_options({"backend": "ray", "ray": {"address": "auto"}, **options})
    message = str(raised.value)
    assert raised.value.key == f"hydra.launcher.{key}"
    assert f"Invalid hydra.launcher.{key}={value!r}:" in message
    assert "Fix:" in message and fix in message


class FakeCluster:
    """What ``plan_ray_slots`` asks of the ``ray`` module: the cluster's resources, its nodes."""

    def __init__(self, gpus: float, cpus: float) -> None:
        self.resources = {"GPU": gpus, "CPU": cpus}

    def cluster_resources(self) -> dict[str, float]:
        return dict(self.resources)

    def nodes(self) -> list[dict[str, Any]]:
        return [{"Alive": True}]


@pytest.mark.parametrize(("gb", "jobs"), [(9.5, 8), (30.0, 2), (100.0, 1), (4.0, 8)])
def test_memory_sizing_gives_ray_the_share_the_local_backend_gives(gb: float, jobs: int) -> None:
    # one GPU of 80 GiB, at most 8 jobs: locally its free memory, on Ray the size named
    options = parse_launcher_options({"gpu_mem_per_job_gb": gb, "max_jobs_per_gpu": 8}).slots
    local = plan_slots(
        options, environ={}, probe=FakeProbe(["0"], {"0": 80 * GIB}), available_cpus=[0, 1]
    )
    ray_plan = plan_ray_slots(options, RayOptions(gpu_memory_gb=80.0), FakeCluster(1, 64))
    assert len(local.slots) == len(ray_plan.slots) == jobs
    assert ray_plan.gpus_per_slot == pytest.approx(1 / jobs)


def test_a_malformed_address_is_named() -> None:
    message = refused({"backend": "ray", "ray": {"address": "head-node"}})
    assert "Invalid hydra.launcher.ray.address='head-node'" in message
    assert "HOST:PORT" in message


def test_the_ray_backend_without_ray_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets where it is absent
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    message = refused({"backend": "ray"})
    assert "Invalid hydra.launcher.backend='ray'" in message
    assert "pip install 'furcate-hydra[ray]'" in message


def test_an_address_where_nothing_answers_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray", reason=RAY_MISSING)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # a server: not refused
    address = f"127.0.0.1:{free_port()}"
    message = refused({"backend": "ray", "ray": {"address": address}})
    assert f"Invalid hydra.launcher.ray.address='{address}'" in message
    assert "nothing answers" in message and "ray start --head" in message


@pytest.mark.parametrize("source", ["option", "environment"])
def test_a_sqlite_store_is_refused_on_a_cluster(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, source: str
) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    options: dict[str, Any] = {"backend": "ray", "ray": {"address": "127.0.0.1:6379"}}
    if source == "option":
        options["mlflow"] = {"tracking_uri": uri}
        key = "hydra.launcher.mlflow.tracking_uri"
    else:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        key = "MLFLOW_TRACKING_URI"
    message = refused(options)
    assert f"Invalid {key}='{uri}'" in message
    assert "cannot reach" in message and "mlflow server" in message


def test_a_sqlite_store_on_a_cluster_stops_the_cli_before_any_job(
    tmp_path: Path, mlflow_store: str
) -> None:
    result = run_probe_sweep(
        tmp_path, "+i=0,1", "hydra.launcher.backend=ray", "hydra.launcher.ray.address=auto"
    )
    assert result.returncode != 0
    assert f"Invalid MLFLOW_TRACKING_URI='{mlflow_store}'" in result.stderr, result.stderr
    assert "mlflow server" in result.stderr
    assert not list((tmp_path / "sweep").glob("*/probe.json"))


def test_a_sqlite_optuna_storage_on_a_cluster_is_served_and_a_file_one_refused(
    tmp_path: Path,
) -> None:
    from furcate_hydra.hydra_api.options import OptionError
    from furcate_hydra.ray_backend.options import Backend
    from furcate_hydra.sweepers.storage_proxy import sweeper_storage_proxy

    key = "hydra.sweeper.storage"
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    # the option's own spelling, which the sweepers' door spells apart
    launcher = {"backend": Backend.RAY.value, "ray": {"address": "127.0.0.1:6379"}}
    # served through the proxy, at this machine's address toward the head, any free port
    assert sweeper_storage_proxy(launcher, key, storage, None) == ("127.0.0.1", 0)
    assert sweeper_storage_proxy(launcher, key, storage, ("127.0.0.2", 13000)) == (
        "127.0.0.2",
        13000,
    )
    # the local backend, a Ray instance of this machine, or an RDB server: opened as it is
    assert sweeper_storage_proxy({"backend": "local"}, key, storage, None) is None
    assert sweeper_storage_proxy({"backend": "ray", "ray": {}}, key, storage, None) is None
    server = "postgresql+psycopg2://user:pw@db.example/optuna"
    assert sweeper_storage_proxy(launcher, key, server, None) is None
    # a file the proxy cannot serve
    with pytest.raises(OptionError) as raised:
        sweeper_storage_proxy(launcher, key, "file:///shared/optuna.log", None)
    message = str(raised.value)
    assert f"Invalid {key}='file:///shared/optuna.log'" in message
    assert "cannot reach" in message and "sqlite:///optuna.db" in message and "Fix:" in message


def test_a_served_study_without_a_head_to_route_to_asks_for_the_proxy_address(
    tmp_path: Path,
) -> None:
    from furcate_hydra.hydra_api.options import OptionError
    from furcate_hydra.sweepers.storage_proxy import sweeper_storage_proxy

    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    launcher = {"backend": "ray", "ray": {"address": "auto"}}
    with pytest.raises(OptionError) as raised:
        sweeper_storage_proxy(launcher, "hydra.sweeper.storage", storage, None)
    message = str(raised.value)
    assert "Invalid hydra.sweeper.storage_proxy=None" in message
    assert "hydra.launcher.ray.address=auto names no head" in message
    assert "Fix: set hydra.sweeper.storage_proxy=HOST:PORT" in message
    # named, it is used as given
    assert sweeper_storage_proxy(launcher, "k.storage", storage, ("10.0.0.5", 0)) == (
        "10.0.0.5",
        0,
    )
