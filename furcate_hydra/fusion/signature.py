"""What members of one fused group share: a signature per member, equal within a group.

Members may differ only in what a group reproduces for each: optimizer hyperparameters, the
floats their steps read that a probe showed can be each member's own bitwise, values their
steps never read, the initial weights, and their random states where the data draws nothing
from them. The signature holds the rest: the module's class and tensors' names, shapes and
dtypes, every other value its steps read (``step_values``), the Trainer's training shape, the
data (its loaders' settings and a fingerprint of the dataset, read without drawing from any
stream), and the random states when the data draws from them. ``differences`` names what sets
a member apart, for its one-line reason to run alone.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler

from furcate_hydra.fusion.member_streams import digest
from furcate_hydra.fusion.optimizer import optimizer_form
from furcate_hydra.fusion.random_states import StreamsKept, capture_rng, moved_streams
from furcate_hydra.fusion.settings import TrainingShape


@dataclass(frozen=True)
class LoaderSignature:
    """A DataLoader's batches, as far as they decide what a member sees and in what order."""

    batch_size: int | None
    drop_last: bool
    order: str  # "sequential", "random from the global stream", "random, seed N", a class
    dataset: str  # class, length and a digest of a few samples
    draws: tuple[str, ...] = ()  # the global streams reading a sample draws from
    workers: int = 0

    @classmethod
    def of(cls, loader: Any) -> LoaderSignature:
        if not isinstance(loader, DataLoader):
            raise TypeError(f"its data is a {type(loader).__name__}, not a torch DataLoader")
        dataset, draws = _dataset_digest(loader.dataset)
        return cls(
            batch_size=loader.batch_size,
            drop_last=bool(loader.drop_last),
            order=_order(loader),
            dataset=dataset,
            draws=draws,
            workers=int(loader.num_workers),
        )

    @property
    def draws_from_streams(self) -> bool:
        """Whether its batches depend on the random states it starts an epoch from."""
        return self.order != "sequential" or bool(self.draws) or self.workers > 0


@dataclass(frozen=True)
class FusionSignature:
    """Equal for all members of a fused group."""

    module_class: str
    tensors: tuple[tuple[str, tuple[int, ...], str], ...]
    training: TrainingShape
    train_data: LoaderSignature
    val_data: LoaderSignature | None
    # the random states at training's start, when the data draws from them: members whose
    # batches follow their seed see different batches and cannot share one loader
    random_stream: str | None
    # the optimizer's class and the flags that change its rule (its hyperparameters may differ)
    optimizer: str = ""
    # what the steps read of the module that a group cannot give each member (path, value)
    step_values: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(
        cls,
        module: nn.Module,
        training: TrainingShape,
        train_loader: Any,
        val_loader: Any | None,
        optimizer: torch.optim.Optimizer | None = None,
        streams: dict[str, Any] | None = None,
        step_values: dict[str, str] | None = None,
    ) -> FusionSignature:
        train = LoaderSignature.of(train_loader)
        val = None if val_loader is None else LoaderSignature.of(val_loader)
        stream = None
        loaders = [train] + ([val] if val is not None else [])
        if streams is not None and any(loader.draws_from_streams for loader in loaders):
            stream = digest(streams, ("torch", *sorted({d for ld in loaders for d in ld.draws})))
        tensors = [*module.named_parameters(), *module.named_buffers()]
        return cls(
            module_class=f"{type(module).__module__}.{type(module).__qualname__}",
            tensors=tuple((name, tuple(t.shape), str(t.dtype)) for name, t in tensors),
            training=training,
            train_data=train,
            val_data=val,
            random_stream=stream,
            optimizer="" if optimizer is None else optimizer_form(optimizer),
            step_values=tuple(sorted((step_values or {}).items())),
        )

    def differences(self, other: FusionSignature) -> list[str]:
        """What sets this member apart from ``other``'s group, one reason each."""
        reasons = []
        if self.module_class != other.module_class:
            reasons.append(f"its module is a {self.module_class.rsplit('.', 1)[-1]}")
        elif self.tensors != other.tensors:
            reasons.append("its parameter shapes differ")
        if self.optimizer != other.optimizer:
            reasons.append(f"its optimizer differs ({self.optimizer}, not {other.optimizer})")
        reasons.extend(_value_differences(dict(self.step_values), dict(other.step_values)))
        for key in self.training.differences(other.training):
            reasons.append(f"its Trainer's {key} differs")
        for label, mine, theirs in (
            ("", self.train_data, other.train_data),
            ("validation ", self.val_data, other.val_data),
        ):
            reasons.extend(_loader_differences(label, mine, theirs))
        if not reasons and self.random_stream != other.random_stream:
            reasons.append(
                "its data draws from its random states, which differ from the group's "
                "(another seed: a shuffled order, augmentation or workers)"
            )
        return reasons


def _value_differences(mine: dict[str, str], theirs: dict[str, str]) -> list[str]:
    """The values a member's steps read that differ from the group's, the first few by path."""
    paths = sorted(p for p in set(mine) | set(theirs) if mine.get(p) != theirs.get(p))
    return [
        f"its module's {path} differs ({mine.get(path, 'unset')}, not "
        f"{theirs.get(path, 'unset')}) and its steps read it"
        for path in paths[:3]
    ]


def _loader_differences(
    label: str, mine: LoaderSignature | None, theirs: LoaderSignature | None
) -> list[str]:
    if mine is None or theirs is None:
        return [] if mine is theirs else [f"its {label}data differs (one has none)"]
    names = {
        "batch_size": "batch size",
        "drop_last": "drop_last",
        "order": "order",
        "dataset": "dataset",
    }
    return [
        f"its {label}{names[f.name]} differs"
        for f in fields(LoaderSignature)
        if getattr(mine, f.name) != getattr(theirs, f.name)
    ]


def _order(loader: DataLoader[Any]) -> str:
    sampler = loader.sampler
    if isinstance(sampler, SequentialSampler):
        return "sequential"
    if isinstance(sampler, RandomSampler):
        generator = sampler.generator if sampler.generator is not None else loader.generator
        if generator is None:
            return "random from the global stream"
        state = hashlib.sha1(generator.get_state().numpy().tobytes()).hexdigest()[:16]
        return f"random, generator state {state}"
    return type(sampler).__qualname__


def _dataset_digest(dataset: Any, samples: int = 3) -> tuple[str, tuple[str, ...]]:
    """Class, length and a digest of the first, middle and last samples' tensors; and which
    global streams reading them drew from (each is as before after: they are read as no run
    of the member reads them)."""
    kind = type(dataset).__qualname__
    try:
        length = len(dataset)
    except TypeError:
        return f"{kind} (no length)", ()
    hashed = hashlib.sha1()
    with StreamsKept() as kept:
        for index in sorted({0, length // 2, length - 1})[:samples] if length else []:
            _feed(hashed, dataset[index])
        after = capture_rng()
    return f"{kind}[{length}] {hashed.hexdigest()[:16]}", moved_streams(kept.before["rng"], after)


def _feed(digest: Any, sample: Any) -> None:
    if isinstance(sample, torch.Tensor):
        digest.update(sample.detach().cpu().contiguous().numpy().tobytes())
    elif isinstance(sample, (list, tuple)):
        for item in sample:
            _feed(digest, item)
    elif isinstance(sample, dict):
        for key in sorted(sample):
            digest.update(str(key).encode())
            _feed(digest, sample[key])
    else:
        digest.update(repr(sample).encode())
