"""A member of a fused group: its ``fit`` brought to the group, and ended as its own run's.

    join_group ──► an Offer (what its fit trains, or why it cannot be fused) ──► rendezvous
      leads: lead (group, train, send each member its end) ─┐
      follows: its end from the leader ─────────────────────┴► Alone(reason) or Trained
    Trained ──► finish_trained (its own fit restores its end) ──► log_member (its loggers'
                calls, its history rows, in its run's order)

The group's leader trained it and sent its end (``fusion.coordinator.Trained``): its own
Lightning checkpoint and its final callback metrics. The member's own ``Trainer.fit`` then
restores that checkpoint (weights, optimizer and scheduler states, loop counters, its
callbacks' states) with its epochs capped where its training ended, so Lightning finds
nothing left to train and returns; the Trainer then holds what the app reads after ``fit``:
``current_epoch``, ``global_step``, its optimizers, ``callback_metrics``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import cloudpickle
import torch

from furcate_hydra.errors import first_line
from furcate_hydra.fusion.coordinator import Alone, EpochEnd, Offer, SendLoaders, Trained, lead
from furcate_hydra.fusion.fit_call import FitCall, read_fit_call
from furcate_hydra.fusion.fused_fit import FusedFitStopped
from furcate_hydra.fusion.lineage import LIGHTNING, derives_from
from furcate_hydra.fusion.member_records import MemberLog
from furcate_hydra.fusion.member_stopping import early_stopping_callbacks
from furcate_hydra.fusion.random_states import (
    StreamsKept,
    capture_rng,
    loader_generators,
    restore_rng,
    restore_streams,
)
from furcate_hydra.fusion.rendezvous import Following, RendezvousError, join, left
from furcate_hydra.lightning._app_checkpoints import save_app_checkpoints
from furcate_hydra.lightning._fused_group import GroupEnv, slot_turn
from furcate_hydra.lightning._history import MetricsHistory
from furcate_hydra.lightning._job_training import JobTraining
from furcate_hydra.lightning._pruning import OptunaPruning
from furcate_hydra.preemption import JobPreempted
from furcate_hydra.progress import write_progress

log = logging.getLogger("furcate_hydra.lightning")


def finish_trained(
    fit: Callable[..., Any],
    trainer: Any,
    model: Any,
    end: Trained,
    *args: Any,
    **kwargs: Any,
) -> None:
    """Run Lightning's own ``fit`` (``fit``: the Trainer's unwrapped method) over ``end``'s
    checkpoint: every state restored, no batch trained; then the member's final metrics."""
    handle, name = tempfile.mkstemp(prefix="furcate-fused-", suffix=".ckpt")
    os.close(handle)
    path = Path(name)
    loop = trainer.fit_loop
    saved = loop.max_epochs, trainer.num_sanity_val_steps
    try:
        torch.save(end.checkpoint, path)
        # where its training ended: a member its early stopping stopped has no epoch left
        loop.max_epochs = int(end.checkpoint["epoch"])
        trainer.num_sanity_val_steps = 0  # nothing to check: it trained already
        kwargs["ckpt_path"] = str(path)
        fit(trainer, model, *args, **kwargs)
    finally:
        loop.max_epochs, trainer.num_sanity_val_steps = saved
        path.unlink(missing_ok=True)
    # Lightning keeps no metrics in a checkpoint: what the member's run ended with, by the
    # names its callback_metrics would hold them
    trainer._logger_connector._callback_metrics.update(end.callback_metrics)
    save_app_checkpoints(trainer)


def join_group(
    group: GroupEnv,
    trainer: Any,
    arguments: dict[str, Any],
    refusal: str | None,
    on_epoch: Callable[[EpochEnd], None],
    signalled: Callable[[], str | None] = lambda: None,
) -> Alone | Trained:
    """Bring this member's ``fit`` to its group (``arguments``: fit's, by name) and return
    its end: trained by the group's leader (this process, or another), or told to run alone.
    ``refusal``: a reason this member cannot be fused that only the job knows (it resumes).
    ``on_epoch``: each of its epochs' ends while the group trains. ``signalled()``: the
    preemption signal this process got, if any.

    Raises:
        GroupPreempted: this process was preempted while its group trained (its last kept
            epoch is where it resumes).
    """
    offer = _offer(trainer, arguments, refusal)
    # whatever the group draws, this process's streams are its own fit's again after: a member
    # left alone trains from them, a trained one takes its end's (``fit_in_group``)
    generators = loader_generators(offer.call.train_loader, offer.call.val_loader)
    try:
        with StreamsKept(generators):
            if group.secret is None:  # no leader would let it in: none waits for it
                left(group.directory, group.key)
                raise RendezvousError("its process was handed no key to its group")
            joined = join(
                group.directory, group.key, group.size, offer, group.gather_s, group.secret
            )
            if isinstance(joined, Following):
                while isinstance(message := joined.receive(), EpochEnd | SendLoaders):
                    if isinstance(message, SendLoaders):
                        joined.send(_loaders_or_none(offer))
                    else:
                        on_epoch(message)
                joined.connection.close()
                return message  # type: ignore[no-any-return]
            try:
                device = trainer.strategy.root_device if offer.call.fusable else None
                with slot_turn(group):  # members left alone wait while the group trains
                    ends = lead(
                        joined,
                        group.fuse_max,
                        device,
                        on_epoch,
                        stop_asked=lambda: signalled() is not None,
                        min_gain=group.min_gain,
                        on_width=group.widths_learned(),
                    )
            finally:
                joined.close()
    except (RendezvousError, FusedFitStopped) as exc:
        name = signalled()
        if name is not None:  # its group stopped for the same signal: it is preempted
            raise GroupPreempted(name) from exc
        if isinstance(exc, FusedFitStopped):
            raise
        # the member still trains, as its own run: only the speed of fusion is lost
        return Alone(f"its group did not form ({exc})")
    return ends[group.key]


class GroupPreempted(Exception):
    """A member's process was preempted while its group trained."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


def _offer(trainer: Any, arguments: dict[str, Any], refusal: str | None) -> Offer:
    """What this member brings; the random streams are as they were before it after (its own
    fit, alone or over its group's end, runs fit's data and module hooks from them again)."""
    before = capture_rng()
    if refusal is not None:
        call = FitCall(reasons=[refusal])
    else:
        try:
            call = read_fit_call(
                trainer,
                arguments.get("model"),
                arguments.get("train_dataloaders"),
                arguments.get("val_dataloaders"),
                arguments.get("datamodule"),
            )
        except Exception as exc:  # its own fit, run alone, raises it where the app expects
            call = FitCall(reasons=[f"reading its fit raised {type(exc).__name__}: {exc}"])
    version = str(
        getattr(sys.modules.get(type(trainer).__module__.split(".")[0]), "__version__", "")
    )
    pruning = [cb for cb in trainer.callbacks if isinstance(cb, OptunaPruning) and cb.active]
    offer = Offer(
        call,
        early_stopping_callbacks(trainer.callbacks),
        version,
        int(trainer.log_every_n_steps),
        pruning[0] if pruning else None,
    )
    unsendable = _cannot_send(offer)
    if unsendable is not None:
        offer = replace(offer, call=replace(call, reasons=[unsendable], member=None))
    restore_rng(before)
    return offer


def _cannot_send(offer: Offer) -> str | None:
    """Why ``offer`` cannot travel to its group's leader (a lock, an open file, a lambda held
    by the module or its callbacks), or None."""
    why = _unpicklable(offer) if offer.call.fusable else None
    return (
        None
        if why is None
        else f"its module, optimizer or callbacks cannot be sent to its group ({why})"
    )


def _loaders_or_none(offer: Offer) -> Any:
    """The loaders the leader asked for, or None where they cannot travel (the leader then
    asks another member)."""
    loaders = (offer.call.train_loader, offer.call.val_loader)
    why = _unpicklable(loaders)
    if why is not None:
        log.info("furcate: fused: this member's loaders cannot be sent (%s)", why)
        return None
    return loaders


def _unpicklable(value: Any) -> str | None:
    """Why ``value`` cannot be pickled as the rendezvous sends it, or None."""
    try:
        cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        return first_line(exc)
    return None


def log_member(trainer: Any, history: MetricsHistory, log: MemberLog) -> None:
    """What its own run would have logged: every logger call in order, its history rows."""
    for logger in trainer.loggers:
        with _one_mlflow_batch(logger):
            for step, metrics in log.logged:
                logger.log_metrics(metrics, step)
        logger.save()
    for record in log.epochs:
        history.add_row(
            record.epoch,
            record.step,
            record.metrics,
            record.validated,
            record.validation_names,
        )


# MLflow takes at most this many metrics in one log_batch
_MLFLOW_BATCH = 1000


@contextlib.contextmanager
def _one_mlflow_batch(logger: Any) -> Iterator[None]:
    """An MLflow logger's calls (each its own ``log_batch``: a store transaction, which a
    group's members would wait for each other to make) sent as one batch at the end; any
    other logger is left as it is."""
    if not derives_from(logger, "MLFlowLogger", LIGHTNING) or logger.run_id is None:
        yield
        return
    client = logger.experiment
    metrics: list[Any] = []
    # Lightning's MLFlowLogger.log_metrics hands its Metric objects to experiment.log_batch
    kept = metrics.extend
    client.log_batch = lambda run_id, metrics=(), **_: kept(metrics)
    try:
        yield
    finally:
        del client.log_batch  # the client's own method again
    for start in range(0, len(metrics), _MLFLOW_BATCH):
        client.log_batch(logger.run_id, metrics=metrics[start : start + _MLFLOW_BATCH])


def keep_epoch(trainer: Any, training: JobTraining, end: EpochEnd) -> None:
    """One of the member's epochs ended in its group: log it and keep its checkpoint, as the
    run's epoch-end one (a job stopped after it resumes from there)."""
    log_member(trainer, training.history, end.log)
    if trainer.is_global_zero and training.history.rows:
        training.history.write()
    checkpoint = dict(end.checkpoint)
    # the history rows and the random states travel in it, as in every checkpoint of furcate's
    callbacks = {
        **checkpoint.get("callbacks", {}),
        training.history.state_key: training.history.state_dict(),
    }
    if end.streams is not None:
        at_end = training.exact.epoch_end_state(end.streams, int(checkpoint["epoch"]))
        callbacks[training.exact.state_key] = at_end
    checkpoint["callbacks"] = callbacks
    if end.log.epochs:  # what the sweep's live view and `furcate status` show of the job
        latest = end.log.epochs[-1]
        write_progress(training.env.paths.progress, latest.epoch, latest.step, latest.metrics)
    # last: once the checkpoint is there, all else of the epoch is
    epochs_done, step = int(checkpoint["epoch"]), int(checkpoint["global_step"])
    training.checkpoint.save_state(checkpoint, epochs_done - 1, step)


def fit_in_group(
    group: GroupEnv,
    fit: Callable[..., Any],
    trainer: Any,
    training: JobTraining,
    arguments: dict[str, Any],
    resumes: bool,
) -> Trained | None:
    """In a job of the fused ``group``: bring ``trainer.fit``'s ``arguments`` to it and, when
    the group trained this member, end the fit as its own run (``fit``: Lightning's, unwrapped)
    and log what its run would have. None: not fused (why is logged), the caller fits."""
    refusal = "it resumes from its checkpoint" if resumes else None
    try:
        end = join_group(
            group,
            trainer,
            arguments,
            refusal,
            lambda epoch: keep_epoch(trainer, training, epoch),
            lambda: training.watch.signal_name,
        )
    except GroupPreempted as stopped:
        # the next attempt resumes from the last epoch its group kept for it
        kept = training.checkpoint.last_saved
        raise JobPreempted(stopped.signal_name, str(kept) if kept else None) from None
    if isinstance(end, Alone):
        log.info("furcate: not fused: %s", end.reason)
        return None
    together, in_process = len(end.group), max(end.in_process, len(end.group))
    log.info(
        "furcate: fused: trained with %d member(s) in one process (%s steps)%s",
        in_process,
        end.step_mode,
        f", {together} at a time" if in_process > together else "",
    )
    rest = {k: v for k, v in arguments.items() if k not in ("self", "model", "ckpt_path")}
    finish_trained(fit, trainer, arguments["model"], end, **rest)
    if end.streams is not None:  # where its own run's random states end
        own = loader_generators(
            arguments.get("train_dataloaders"), arguments.get("val_dataloaders")
        )
        restore_streams(end.streams, own)
    log_member(trainer, training.history, end.log)
    return end


@contextlib.contextmanager
def alone_in_group(group: GroupEnv | None, training: JobTraining) -> Iterator[Path | None]:
    """Around the own ``fit`` of a member its group did not train: one such fit at a time on
    the group's slot (as one job at a time without fusion). Yields the checkpoint its group
    kept last, if its leader trained some of its epochs before it was gone: the fit resumes
    there (no epoch trained twice, no metric logged twice)."""
    if group is None:
        yield None
        return
    with slot_turn(group):
        yield training.checkpoint.last_saved
