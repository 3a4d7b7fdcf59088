"""Tests for the reference app (train.py at the repository root), without Hydra."""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
import pytest
from hydra.core.singleton import Singleton
from omegaconf import DictConfig, OmegaConf

if TYPE_CHECKING:
    from furcate_hydra.lightning import JobEnv


ROOT = Path(__file__).resolve().parents[1]


def _load_train() -> ModuleType:
    """Import train.py by path: pytest does not put the repo root on sys.path in every mode."""
    if "train" in sys.modules:
        return sys.modules["train"]
    spec = importlib.util.spec_from_file_location("train", ROOT / "train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered before executing: dataclasses look their module up in sys.modules.
    sys.modules["train"] = module
    # @hydra.main sets Hydra's process-wide VersionBase while decorating; keep that out of
    # the other tests, which rely on Hydra's defaults.
    state = Singleton.get_state()
    try:
        spec.loader.exec_module(module)
    finally:
        Singleton.set_state(state)
    return module


@pytest.fixture(scope="module")
def train() -> ModuleType:
    """train.py, imported when a test here first needs it (it imports torch and Lightning)."""
    return _load_train()


# scikit-learn's loader of each bundled dataset, by name (imported by the test that loads one)
RAW = {"digits": "load_digits", "breast_cancer": "load_breast_cancer", "wine": "load_wine"}
# (rows, features, classes) of scikit-learn's bundled copies.
SHAPES = {"digits": (1797, 64, 10), "breast_cancer": (569, 30, 2), "wine": (178, 13, 3)}


def make_cfg(**overrides: object) -> DictConfig:
    """The shipped conf/config.yaml without its Hydra defaults list, plus overrides."""
    cfg = OmegaConf.load(ROOT / "conf" / "config.yaml")
    assert isinstance(cfg, DictConfig)
    cfg.pop("defaults")
    for key, value in overrides.items():
        cfg[key] = value
    return cfg


@pytest.mark.parametrize("data_name", sorted(SHAPES))
def test_data_shapes_and_train_only_standardisation(train: ModuleType, data_name: str) -> None:
    import torch

    rows, features, classes = SHAPES[data_name]
    data = train.load_data(data_name, val_fraction=0.2, seed=0)

    assert data.num_features == features
    assert data.num_classes == classes
    assert len(data.x_train) + len(data.x_val) == rows
    assert len(data.x_val) == pytest.approx(0.2 * rows, abs=classes)
    assert data.x_train.dtype == torch.float32 and data.y_train.dtype == torch.int64
    assert data.x_train.shape == (len(data.y_train), features)
    assert data.x_val.shape == (len(data.y_val), features)
    # Disjoint split covering every row.
    assert sorted(np.concatenate([data.train_index, data.val_index]).tolist()) == list(range(rows))

    # Statistics recomputed here from the raw training rows must be the ones applied.
    import sklearn.datasets

    raw = getattr(sklearn.datasets, RAW[data_name])()
    x = np.asarray(raw.data, dtype=np.float64)
    mean = x[data.train_index].mean(axis=0)
    std = x[data.train_index].std(axis=0)
    std[std == 0.0] = 1.0
    np.testing.assert_allclose(data.mean, mean)
    np.testing.assert_allclose(data.std, std)
    np.testing.assert_allclose(data.x_val.numpy(), (x[data.val_index] - mean) / std, atol=1e-5)
    np.testing.assert_array_equal(data.y_val.numpy(), raw.target[data.val_index])

    # Train features are centred exactly; val features are not, which would be the case
    # if statistics from all rows (or from the val rows) had been used.
    assert np.abs(data.x_train.numpy().mean(axis=0)).max() < 1e-5
    assert np.abs(data.x_val.numpy().mean(axis=0)).max() > 1e-3
    full_mean = x.mean(axis=0)
    assert not np.allclose(data.mean, full_mean)

    # Stratified: class proportions in val follow the whole dataset's.
    val_share = np.bincount(data.y_val.numpy(), minlength=classes) / len(data.y_val)
    all_share = np.bincount(raw.target, minlength=classes) / rows
    np.testing.assert_allclose(val_share, all_share, atol=0.03)


def test_split_depends_on_seed_only(train: ModuleType) -> None:
    a = train.load_data("wine", val_fraction=0.2, seed=0)
    b = train.load_data("wine", val_fraction=0.2, seed=0)
    c = train.load_data("wine", val_fraction=0.2, seed=1)
    np.testing.assert_array_equal(a.val_index, b.val_index)
    assert not np.array_equal(a.val_index, c.val_index)


def test_unknown_data_name_is_named_in_error(train: ModuleType) -> None:
    with pytest.raises(ValueError, match=r"data_name='mnist'.*digits, breast_cancer, wine"):
        train.load_data("mnist", val_fraction=0.2, seed=0)


def test_unknown_optimizer_is_named_in_error(train: ModuleType) -> None:
    data = train.load_data("wine", val_fraction=0.2, seed=0)
    with pytest.raises(ValueError, match=r"optimizer='LBFGS'.*Adam, AdamW, SGD, Adadelta, RMSprop"):
        train.build_model(make_cfg(optimizer="LBFGS"), data)


@pytest.mark.parametrize("name", ["Adam", "AdamW", "SGD", "Adadelta", "RMSprop"])
def test_each_optimizer_is_built_with_config_values(train: ModuleType, name: str) -> None:
    import torch

    data = train.load_data("wine", val_fraction=0.2, seed=0)
    cfg = make_cfg(optimizer=name, learning_rate=0.05, weight_decay=0.01, hidden_sizes=[8, 4])
    model = train.build_model(cfg, data)
    optimizer = model.configure_optimizers()
    assert type(optimizer) is getattr(torch.optim, name)
    assert optimizer.defaults["lr"] == 0.05
    assert optimizer.defaults["weight_decay"] == 0.01
    logits = model(data.x_val)
    assert logits.shape == (len(data.x_val), 3)


def test_dataloaders_follow_config(train: ModuleType) -> None:
    data = train.load_data("wine", val_fraction=0.2, seed=0)
    loader, val_loader = train.build_dataloaders(data, batch_size=16, num_workers=0)
    assert loader.batch_size == 16 and loader.num_workers == 0
    assert not loader.persistent_workers and not val_loader.persistent_workers
    x, y = next(iter(loader))
    assert x.shape == (16, 13) and y.shape == (16,)
    # persistent_workers is only legal, and only set, with worker processes.
    with_workers, _ = train.build_dataloaders(data, batch_size=16, num_workers=1)
    assert with_workers.persistent_workers


def fresh_env(directory: Path) -> JobEnv:
    from furcate_hydra.lightning import JobEnv

    return JobEnv(output_dir=directory, checkpoint_dir=directory / "checkpoints")


def test_short_training_run_beats_chance(train: ModuleType, tmp_path: Path) -> None:
    cfg = make_cfg(data_name="digits", epochs=2, learning_rate=1e-2, accelerator="cpu")
    acc = train.fit_and_evaluate(cfg, fresh_env(tmp_path / "a"))
    assert isinstance(acc, float)
    # Chance is 0.1 for 10 classes; this setup reaches ~0.96 for seeds 0-2, so 0.8 leaves
    # a wide margin while still catching broken preprocessing or a model that does not learn.
    assert 0.8 < acc <= 1.0
    # Seeded and deterministic: the same config gives the same number.
    assert train.fit_and_evaluate(cfg, fresh_env(tmp_path / "b")) == acc
    history = json.loads((tmp_path / "a" / "history.json").read_text())
    assert [row["epoch"] for row in history] == [0, 1]
    assert (tmp_path / "a" / "plots" / "acc.png").exists()
    assert (tmp_path / "a" / "final.ckpt").exists()


def test_main_returns_and_logs_val_acc(
    train: ModuleType,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # outside Hydra, the job's files go to the working dir
    # hydra.main passes an explicit config straight to the task function, skipping Hydra.
    cfg = make_cfg(data_name="wine", epochs=1, accelerator="cpu")
    with caplog.at_level(logging.INFO, logger="train"):
        acc = train.main(cfg)
    assert isinstance(acc, float) and 0.0 <= acc <= 1.0
    (line,) = [r.getMessage() for r in caplog.records if r.name == "train"]
    assert "data_name=wine" in line and "optimizer=Adam" in line
    assert line.endswith(f"val_acc={acc:.4f}")
