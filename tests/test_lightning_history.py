"""MetricsHistory rows (in history.json and in the checkpoint) and the learning-curve plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_rows_are_per_epoch_and_travel_in_each_checkpoint(tmp_path: Path) -> None:
    import torch

    from tests.lightning_helpers import BATCHES_PER_EPOCH, run_fit, standalone_env

    env = standalone_env(tmp_path)
    _, result = run_fit(env, max_epochs=3, check_val_every_n_epoch=2)
    rows = json.loads(result.history_path.read_text())

    assert [(r["epoch"], r["step"]) for r in rows] == [
        (e, (e + 1) * BATCHES_PER_EPOCH) for e in range(3)
    ]
    # logged in LightningModule.on_train_epoch_end, still in the same epoch's row
    assert [r["epoch_marker"] for r in rows] == [0.0, 1.0, 2.0]
    # validation ran in epoch 1 only; Lightning keeps showing its value, the history does not
    assert ["val_loss" in r for r in rows] == [False, True, False]
    assert all(isinstance(r["train_loss"], float) for r in rows)
    # Lightning's on_step/on_epoch copies of train_loss are left out
    assert not any(k.endswith(("_step", "_epoch")) for r in rows for k in r)

    # the checkpoint saved at the end of epoch 2 already holds epoch 2's row
    saved = torch.load(result.checkpoint_path, weights_only=False)  # type: ignore[arg-type]
    assert saved["callbacks"]["MetricsHistory"]["rows"] == rows


def test_history_listed_after_a_checkpoint_warns(tmp_path: Path) -> None:
    import pytorch_lightning as pl

    from furcate_hydra.lightning import AtomicCheckpoint, MetricsHistory
    from tests.lightning_helpers import OPTIONS, TinyModule, loaders

    history = MetricsHistory(tmp_path)
    trainer = pl.Trainer(
        **OPTIONS,
        logger=False,
        max_epochs=1,
        callbacks=[AtomicCheckpoint(tmp_path / "checkpoints"), history],
    )
    with pytest.warns(UserWarning, match="after AtomicCheckpoint.*List MetricsHistory before"):
        trainer.fit(TinyModule(), **loaders())
    assert [r["epoch"] for r in history.rows] == [0]


def test_state_dict_round_trip(tmp_path: Path) -> None:
    from furcate_hydra.lightning import MetricsHistory

    history = MetricsHistory(tmp_path)
    state = {"rows": [{"epoch": 0, "step": 4, "loss": 1.5}], "callback_metrics": {"loss": 1.5}}
    history.load_state_dict(state)
    assert history.state_dict() == state
    assert json.loads(history.write().read_text()) == [{"epoch": 0, "step": 4, "loss": 1.5}]


def test_a_fit_resumed_with_nothing_left_ends_with_its_last_epochs_metrics(
    tmp_path: Path,
) -> None:
    """Killed after its last epoch's checkpoint, a job resumes there: the app reads what its
    uninterrupted fit ended with from callback_metrics, as it would have."""
    import lightning as L

    from furcate_hydra.lightning import MetricsHistory
    from tests.test_fusion_engine import QUIET, TinyMLP, _loaders

    def trainer(history: MetricsHistory) -> L.Trainer:
        options = {**QUIET, "enable_checkpointing": True, "default_root_dir": tmp_path}
        # furcate gives either namespace's Trainer its callbacks (typed as pytorch_lightning's)
        return L.Trainer(**options, max_epochs=2, callbacks=[history])  # type: ignore[list-item]

    first = trainer(MetricsHistory(tmp_path / "a"))
    first.fit(TinyMLP(0.1, 0.0), *_loaders())
    ended = {k: float(v) for k, v in first.callback_metrics.items()}
    first.save_checkpoint(tmp_path / "end.ckpt")
    resumed = trainer(MetricsHistory(tmp_path / "b"))
    resumed.fit(TinyMLP(0.1, 0.0), *_loaders(), ckpt_path=tmp_path / "end.ckpt")
    assert {k: float(v) for k, v in resumed.callback_metrics.items()} == ended


@pytest.mark.parametrize(
    ("name", "family", "split"),
    [
        ("train_loss", "loss", "train"),
        ("val_loss", "loss", "val"),
        ("validation_loss", "loss", "val"),
        ("train/acc", "acc", "train"),
        ("val/acc", "acc", "val"),
        ("acc/val", "acc", "val"),
        ("train_loss_epoch", "loss", "train"),
        ("f1_epoch", "f1", None),
        ("lr-SGD", "lr-SGD", None),
        ("trainer_loss", "trainer_loss", None),
    ],
)
def test_split_metric_name(name: str, family: str, split: str | None) -> None:
    from furcate_hydra.lightning._plots import split_metric_name

    assert split_metric_name(name) == (family, split)


def test_families_pair_train_with_val() -> None:
    from furcate_hydra.lightning._plots import metric_families

    names = ["val_loss", "train_loss", "train/acc", "val/acc", "lr", "train_loss_epoch"]
    assert metric_families(names) == {
        "acc": {"train": "train/acc", "val": "val/acc"},
        "loss": {"train": "train_loss", "val": "val_loss"},
        "lr": {"lr": "lr"},
    }


def test_one_png_per_family(tmp_path: Path) -> None:
    from furcate_hydra.lightning._plots import plot_history

    rows = [
        {"epoch": 0, "step": 4, "train_loss": 1.0, "val_loss": 1.2, "train/acc": 0.5, "lr": 0.1},
        {"epoch": 1, "step": 8, "train_loss": 0.8, "train/acc": 0.6, "val/acc": 0.55, "lr": 0.1},
        {"epoch": 2, "step": 12, "train_loss": 0.7, "val_loss": 0.9, "val/acc": 0.7, "lr": 0.05},
    ]
    paths = plot_history(rows, tmp_path)

    assert [p.name for p in paths] == ["acc.png", "loss.png", "lr.png"]
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [p.name for p in paths]
    for path in paths:
        assert path.read_bytes().startswith(PNG_MAGIC)
        assert path.stat().st_size > 1000


def test_fit_plots_train_and_val_loss_together(tmp_path: Path) -> None:
    from tests.lightning_helpers import run_fit, standalone_env

    _, result = run_fit(standalone_env(tmp_path), max_epochs=2)
    assert [p.name for p in result.plot_paths] == ["epoch_marker.png", "loss.png"]
    assert all(p.read_bytes().startswith(PNG_MAGIC) for p in result.plot_paths)


def test_nothing_to_plot(tmp_path: Path) -> None:
    from furcate_hydra.lightning._plots import plot_history

    assert plot_history([{"epoch": 0, "step": 0}], tmp_path) == []
    assert not (tmp_path / "plots").exists()
