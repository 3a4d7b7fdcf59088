"""Both Lightning namespaces from one code base: ``fit`` and furcate's callbacks take modules,
Trainers and callbacks of ``lightning.pytorch`` and of ``pytorch_lightning``, decided from the
app's objects; a mix is refused, naming what to change."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from furcate_hydra.errors import FurcateConfigError


def lightning_module() -> Any:
    """A module written ``import lightning as L``: one linear layer, a validation loss."""
    import lightning as L
    import torch

    class Linear(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("train_loss", loss, on_epoch=True)
            return loss

        def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    return Linear()


def test_fit_trains_a_lightning_pytorch_module_in_a_trainer_of_that_namespace(
    tmp_path: Path, mlflow_store: str
) -> None:
    from mlflow.tracking import MlflowClient

    from furcate_hydra.lightning import JobEnv, fit
    from furcate_hydra.lightning._namespace import namespace_of
    from tests.lightning_helpers import OPTIONS, history_epochs, loaders

    client = MlflowClient(mlflow_store)
    run_id = client.create_run(client.create_experiment("e")).info.run_id
    env = JobEnv(tmp_path, tmp_path / "resume", tracking_uri=mlflow_store, run_id=run_id)
    seen: list[Any] = []

    import lightning as L

    class Spy(L.Callback):
        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            seen.append(trainer)

    result = fit(
        lightning_module(),
        **loaders(),
        trainer_options={**OPTIONS, "max_epochs": 2, "callbacks": [Spy()]},
        env=env,
    )
    assert result.epochs_completed == 2
    assert str(namespace_of(seen[0])) == "lightning.pytorch"
    assert history_epochs(result.history_path) == [0, 1]
    assert [m.step for m in client.get_metric_history(run_id, "val_loss")] != []
    # the bound logger is of the Trainer's namespace
    import pytorch_lightning as pl

    (logger,) = seen[0].loggers
    assert isinstance(logger, L.pytorch.loggers.MLFlowLogger)
    assert not isinstance(logger, pl.loggers.MLFlowLogger)


def test_fit_refuses_a_callback_of_the_other_namespace_naming_its_twin(tmp_path: Path) -> None:
    from pytorch_lightning.callbacks import LearningRateMonitor

    from furcate_hydra.lightning import JobEnv, fit
    from tests.lightning_helpers import OPTIONS, loaders

    with pytest.raises(FurcateConfigError) as caught:
        fit(
            lightning_module(),
            **loaders(),
            trainer_options={**OPTIONS, "max_epochs": 1, "callbacks": [LearningRateMonitor()]},
            env=JobEnv(tmp_path, tmp_path / "resume"),
        )
    message = str(caught.value)
    assert message.startswith(
        "Invalid trainer_options.callbacks='pytorch_lightning.callbacks.lr_monitor."
        "LearningRateMonitor': it is a `pytorch_lightning` class, but the Trainer is a "
        "`lightning.pytorch` Trainer"
    )
    assert "Fix: use lightning.pytorch.callbacks.lr_monitor.LearningRateMonitor instead" in message


def test_an_apps_own_class_of_the_other_namespace_is_named_with_its_file_and_import() -> None:
    import lightning as L
    import pytorch_lightning as pl

    from furcate_hydra.lightning._namespace import trainer_namespace

    class AppCallback(pl.Callback):
        pass

    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    with pytest.raises(FurcateConfigError) as caught:
        trainer_namespace(trainer, [("Trainer(callbacks=...)", AppCallback())])
    message = str(caught.value)
    assert f"in {__file__}, replace `import pytorch_lightning as pl`" in message
    assert "with `import lightning as L`" in message


def test_furcates_callbacks_are_callbacks_of_both_namespaces(tmp_path: Path) -> None:
    import lightning.pytorch as L
    import pytorch_lightning as pl

    from furcate_hydra.lightning import AtomicCheckpoint, MetricsHistory, OptunaPruning

    for callback in (AtomicCheckpoint(tmp_path), MetricsHistory(tmp_path)):
        assert isinstance(callback, L.callbacks.Checkpoint)
        assert isinstance(callback, pl.callbacks.Checkpoint)
    idle = OptunaPruning.from_environ({})
    assert isinstance(idle, L.Callback) and isinstance(idle, pl.Callback)
