"""A sweep snapshot in words: the plain status line and the pieces the live view shows."""

from __future__ import annotations

from collections.abc import Mapping

from furcate_hydra.monitor.tally import SweepSnapshot

__all__ = ["counts_text", "duration_text", "metrics_text", "status_line", "timing_text"]

# A job line shows this many of its latest metrics: enough to see training move.
_SHOWN_METRICS = 2


def duration_text(seconds: float | None) -> str:
    """``12s``, ``3m05s``, ``2h04m``; ``?`` when unknown."""
    if seconds is None:
        return "?"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def metrics_text(metrics: Mapping[str, float], epoch: int | None = None) -> str:
    """``epoch 3 val_loss=0.231 acc=0.91``: the epoch and the first metrics, by name."""
    parts = [] if epoch is None else [f"epoch {epoch}"]
    for name in sorted(metrics)[:_SHOWN_METRICS]:
        parts.append(f"{name}={metrics[name]:.4g}")
    return " ".join(parts)


def counts_text(snap: SweepSnapshot) -> str:
    text = (
        f"{snap.done} done, {snap.failed} failed, {snap.skipped} skipped, "
        f"{len(snap.running)} running, {snap.queued} queued"
    )
    if snap.pruned:
        text += f" ({snap.pruned} of the done pruned)"
    return text


def timing_text(snap: SweepSnapshot) -> str:
    text = f"{duration_text(snap.elapsed_s)} elapsed"
    if snap.running or snap.queued:
        text += f", ETA {duration_text(snap.eta_s)}"
    return text


def status_line(snap: SweepSnapshot) -> str:
    """One line for a log: counts, times, the best result when the sweeper has one."""
    line = f"furcate: {counts_text(snap)} | {timing_text(snap)}"
    if snap.best:
        line += f" | best {snap.best}"
    return line
