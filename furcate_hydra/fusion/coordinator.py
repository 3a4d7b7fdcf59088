"""What the leader of a fused group does with what its members brought: form the groups,
tell each member left alone why, train each group as one, and hand every member its own
end: its Lightning checkpoint, its final callback metrics, its progress.

A member brings an ``Offer``: its module and fit as ``read_fit_call`` read them (or the
reasons it cannot be fused), its callbacks (its early stopping), its signature. The module
travels pickled, by reference to its class: every member process is a fork of the same
launcher, so the class is importable wherever it arrives.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from furcate_hydra.fusion.fit_call import FitCall
from furcate_hydra.fusion.fused_fit import FusedFitStopped, MemberTraining, fused_fit, to_device
from furcate_hydra.fusion.group_width import Width, learned_width
from furcate_hydra.fusion.grouping import Candidate, even_cut, form_groups
from furcate_hydra.fusion.member_checkpoint import lightning_checkpoint
from furcate_hydra.fusion.member_progress import MemberProgress
from furcate_hydra.fusion.member_records import MemberLog, MemberRecords
from furcate_hydra.fusion.member_stopping import MemberStopping, Pruning
from furcate_hydra.fusion.rendezvous import Leading, RendezvousError
from furcate_hydra.fusion.sample_batch import sample_batch
from furcate_hydra.fusion.signature import FusionSignature

log = logging.getLogger(__name__)

# How often a group's members keep an epoch's end (checkpoint, metrics, history): a kill
# loses at most this much of the group's training beyond an epoch.
KEEP_EVERY_S = 2.0


@dataclass
class Offer:
    """What one member brings to its group, at its ``fit``."""

    call: FitCall
    callbacks: list[Any] = field(default_factory=list)
    lightning_version: str = ""
    log_every_n_steps: int = 50  # its Trainer's: when its loggers get step values
    pruning: Pruning | None = None  # its trial's, when an Optuna sweeper prunes it
    # read in the member's process, at its fit (its random stream is its own there)
    signature: FusionSignature | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        call = self.call
        if call.reasons or call.member is None or call.shape is None:
            return
        member = call.member
        self.signature = FusionSignature.of(
            member.module,
            call.shape,
            call.train_loader,
            call.val_loader,
            member.optimizer,
            call.streams,
            call.step_values,
        )

    def __getstate__(self) -> dict[str, Any]:
        # sent without its data: a group trains on one member's loaders, asked for then
        # (``SendLoaders``), and 32 copies of a dataset would cross the sockets for nothing
        state = dict(self.__dict__)
        state["call"] = replace(self.call, train_loader=None, val_loader=None)
        return state


@dataclass(frozen=True)
class SendLoaders:
    """Send your training and validation loaders: your group trains on them."""


@dataclass(frozen=True)
class Alone:
    """Run your own ``fit``: no group trains you."""

    reason: str


@dataclass(frozen=True)
class EpochEnd:
    """One of your epochs ended: your checkpoint at its end (as your run's epoch-end one),
    and what your loggers and history got since the last you heard (more comes: go on
    listening)."""

    checkpoint: dict[str, Any]
    log: MemberLog
    streams: dict[str, Any] | None = None  # its random states at that end (random_states)


@dataclass(frozen=True)
class Trained:
    """Your end, as your own run would have ended: load it and go on after ``fit``."""

    checkpoint: dict[str, Any]
    callback_metrics: dict[str, torch.Tensor]
    group: tuple[str, ...]
    step_mode: str
    log: MemberLog = field(default_factory=MemberLog)  # what its loggers and history get
    in_process: int = 0  # the members in its process, ``group`` trained at once among them
    streams: dict[str, Any] | None = None  # its random states at its end, as its own run's


def lead(
    leading: Leading,
    fuse_max: int,
    device: torch.device | None = None,
    own_epoch: Callable[[EpochEnd], None] | None = None,
    keep_every_s: float = KEEP_EVERY_S,
    stop_asked: Callable[[], bool] | None = None,
    min_gain: float | None = None,
    on_width: Callable[[list[str], Width], None] | None = None,
) -> dict[str, Alone | Trained]:
    """Form the groups, train them, send every other member its epochs' ends (at most every
    ``keep_every_s``) and its end; every end, by key (the leader's own among them, under
    ``leading.members[0].key``; its epochs' ends go to ``own_epoch``). ``stop_asked``: see
    ``fused_fit``; its ``FusedFitStopped`` goes on, the members' lines closing with it.

    ``min_gain``: None, groups of at most ``fuse_max``; else each group's width is learned
    (``group_width``) and its members train that many at a time, one part after another;
    ``on_width(group, width)`` hears each group's measurement."""
    offers: dict[str, Offer] = {m.key: m.payload for m in leading.members}
    candidates = [
        Candidate(key, offer.signature, tuple(offer.call.reasons)) for key, offer in offers.items()
    ]
    # learned: one group of every member alike (a leader whose others never came has 1)
    grouping = form_groups(candidates, fuse_max if min_gain is None else max(len(candidates), 2))
    ends: dict[str, Alone | Trained] = {
        key: Alone(reason) for key, reason in grouping.alone.items()
    }
    for key, end in ends.items():
        leading.send(key, end)  # the leader's own goes nowhere: it has no line

    def tell(key: str, message: EpochEnd) -> None:
        if key == leading.members[0].key:
            if own_epoch is not None:
                own_epoch(message)
        else:
            leading.send(key, message)

    def loaders(group: list[str]) -> tuple[Any, Any] | None:
        """A group's loaders (its members' are alike): one this process holds, else the
        first member's that can send them (None: none can)."""
        for key in group:
            call = offers[key].call
            if call.train_loader is not None:
                return call.train_loader, call.val_loader
        for key in group:
            try:
                answer: tuple[Any, Any] | None = leading.ask(key, SendLoaders())
            except RendezvousError:
                continue  # that member's process is gone: its job's end is the launcher's
            if answer is not None:
                return answer
        return None

    own = offers[leading.members[0].key].call.member
    own_weights = None if own is None else copy.deepcopy(own.module.state_dict())
    for group in grouping.groups:
        data = loaders(group)
        if data is None:
            for key in group:
                ends[key] = Alone("its data cannot be sent to its group (it cannot be pickled)")
                leading.send(key, ends[key])
            continue
        parts, mode = [group], "auto"
        if min_gain is not None:
            width = _width(group, offers, data[0], device, min_gain)
            if width is not None:
                parts, mode = even_cut(group, width.width), width.mode
                if on_width is not None:
                    on_width(group, width)
        # each part trains from its first member's random states (MemberStreams), so every
        # part sees the batches the first saw
        for part in parts:
            try:
                trained = _train(part, offers, data, device, tell, keep_every_s, stop_asked, mode)
            except FusedFitStopped:
                raise
            except Exception as exc:  # each member still trains, as its own run would
                log.warning("furcate: fused: a group's training failed, its members run alone: "
                            "%s: %s", type(exc).__name__, exc, exc_info=True)  # fmt: skip
                failed = Alone(f"its group's training failed ({type(exc).__name__}: {exc})")
                if own_weights is not None and leading.members[0].key in part:
                    # the leader's own module got the group's epochs' ends: its own fit starts
                    # from its weights at fit (or from its last kept epoch)
                    _member(offers[leading.members[0].key]).module.load_state_dict(own_weights)
                for key in part:
                    ends[key] = failed
                    leading.send(key, failed)
                continue
            for key, end in trained.items():
                ends[key] = replace(end, in_process=len(group))
                leading.send(key, ends[key])
    return ends


def _width(
    group: list[str],
    offers: dict[str, Offer],
    train_loader: Any,
    device: torch.device | None,
    min_gain: float,
) -> Width | None:
    """How many of the group train at once, measured on a sample of its data (None: its
    loader gives none to measure on, and the group trains whole)."""
    batch = sample_batch(train_loader)
    if batch is None:
        return None
    device = device or torch.device("cpu")
    members = [_member(offers[key]) for key in group]
    shape = offers[group[0]].call.shape
    assert shape is not None
    return learned_width(
        [m.module for m in members],
        [m.optimizer for m in members],
        to_device(batch, device),
        shape.accumulate_grad_batches,
        device,
        min_gain,
    )


def _train(
    group: list[str],
    offers: dict[str, Offer],
    data: tuple[Any, Any],
    device: torch.device | None,
    tell: Callable[[str, EpochEnd], None],
    keep_every_s: float,
    stop_asked: Callable[[], bool] | None,
    step_mode: str,
) -> dict[str, Trained]:
    first = offers[group[0]].call
    assert first.shape is not None
    # each member's module, optimizer and schedulers came in one pickle: the optimizer still
    # holds that module's parameters, the schedulers that optimizer
    members = [_member(offers[key]) for key in group]
    stopping = MemberStopping(
        [offers[key].callbacks for key in group],
        first.shape,
        [offers[key].pruning for key in group],
    )
    observer = MemberRecords(stopping, [offers[key].log_every_n_steps for key in group])
    sent = [MemberLog() for _ in group]  # how much of each member's log it has had

    def checkpoint(index: int, progress: MemberProgress) -> dict[str, Any]:
        states = {_state_key(cb): cb.state_dict() for cb in stopping.stoppers[index]}
        version = offers[group[index]].lightning_version
        return lightning_checkpoint(members[index], progress, version, states)

    def unsent(index: int) -> MemberLog:
        log, done = observer.logs[index], sent[index]
        new = MemberLog(log.logged[len(done.logged) :], log.epochs[len(done.epochs) :])
        sent[index] = MemberLog(list(log.logged), list(log.epochs))
        return new

    told = time.monotonic()

    def epoch_done(
        trained: torch.Tensor, progress: list[MemberProgress], streams: list[dict[str, Any]]
    ) -> None:
        nonlocal told
        # each member's run writes its metrics, history and checkpoint when it hears: every
        # few seconds, not every epoch (a tiny model's epochs take milliseconds, and a group's
        # members writing to one store at once wait for each other)
        if time.monotonic() - told < keep_every_s:
            return
        told = time.monotonic()
        for index in torch.nonzero(trained).flatten().tolist():
            end = EpochEnd(checkpoint(index, progress[index]), unsent(index), streams[index])
            tell(group[index], end)

    outcome = fused_fit(
        members,
        first.shape,
        data[0],
        data[1],
        observer,
        device,
        step_mode=step_mode,
        on_epoch=epoch_done,
        stop_asked=stop_asked,
        drawn_streams=_drawn(offers[group[0]]),
    )
    ends = {}
    for index, key in enumerate(group):
        metrics = {
            name: value.detach().cpu() for name, value in stopping.final.metrics[index].items()
        }
        ends[key] = Trained(
            checkpoint(index, outcome.progress[index]),
            metrics,
            tuple(group),
            outcome.step_mode,
            unsent(index),
            streams=outcome.streams[index] if outcome.streams else None,
        )
    return ends


def _drawn(offer: Offer) -> tuple[str, ...]:
    """The global streams besides torch's that reading the group's samples draws from."""
    signature = offer.signature
    if signature is None:
        return ()
    loaders = [signature.train_data] + ([signature.val_data] if signature.val_data else [])
    return tuple(sorted({kind for loader in loaders for kind in loader.draws} - {"torch"}))


def _member(offer: Offer) -> MemberTraining:
    assert offer.call.member is not None
    return offer.call.member


def _state_key(callback: Any) -> str:
    """Where Lightning keeps a callback's state in a checkpoint."""
    return str(getattr(callback, "state_key", type(callback).__qualname__))
