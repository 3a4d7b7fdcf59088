"""Synthetic classification data: Gaussian blobs, made from a seed, no download."""

from __future__ import annotations

import time

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset


class SlowDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """``data`` with a pause per sample: slow enough to stop a job mid-epoch on purpose."""

    def __init__(self, data: TensorDataset, sample_sleep: float) -> None:
        self.data = data
        self.sample_sleep = sample_sleep

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.sample_sleep:
            time.sleep(self.sample_sleep)
        return self.data[index]  # type: ignore[no-any-return]


class BlobsDataModule(L.LightningDataModule):
    def __init__(
        self,
        samples: int = 512,
        features: int = 16,
        classes: int = 4,
        batch_size: int = 32,
        sample_sleep: float = 0.0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.samples, self.features, self.classes = samples, features, classes
        self.batch_size, self.sample_sleep, self.num_workers = batch_size, sample_sleep, num_workers
        self.train: Dataset[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.val: TensorDataset | None = None

    def setup(self, stage: str | None = None) -> None:
        generator = torch.Generator().manual_seed(1234)  # the same data in every job
        centers = torch.randn(self.classes, self.features, generator=generator) * 2
        labels = torch.randint(0, self.classes, (self.samples,), generator=generator)
        points = centers[labels] + torch.randn(self.samples, self.features, generator=generator)
        split = self.samples * 3 // 4
        self.train = SlowDataset(TensorDataset(points[:split], labels[:split]), self.sample_sleep)
        self.val = TensorDataset(points[split:], labels[split:])

    def train_dataloader(self) -> DataLoader[tuple[torch.Tensor, torch.Tensor]]:
        assert self.train is not None
        return DataLoader(
            self.train,
            batch_size=self.batch_size,
            shuffle=True,
            num_workers=self.num_workers,
        )

    def val_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        assert self.val is not None
        return DataLoader(self.val, batch_size=self.batch_size)

    def test_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        return self.val_dataloader()
