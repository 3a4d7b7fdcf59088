"""A config runs once, however many launchers sweep it: claim it in the store, then check.

Before a job starts, its launcher claims the config: it creates the job's run, RUNNING, with the
fingerprint and its own identity (a stand-in run, for a job that would resume an interrupted
run). Then it reads the RUNNING runs of that fingerprint whose launchers are alive, the rivals:

- a rival that won holds the config: this claim is lost. A winner has logged the job's params
  (what it does first, in the one MLflow call that logged them before claims existed) or, for a
  config without params and for a resumed run, tagged ``furcate.claim=won``;
- no rival: won (any later claim sees this one);
- otherwise the earliest claim, by (start time, run id), is the candidate: the others have
  lost; the candidate waits until the rivals it saw have withdrawn, then has won.

Neither sqlite nor an MLflow server gives runs a unique constraint or an order of commits, and a
run's start time is its launcher's clock, read before the run is written. So the earliest start
does not win outright: a claim written late (a busy store) may carry the earliest time after
another launcher has looked, seen no rival and won. Two claims never both win: of any two, the
later one to look sees the other; a claim that saw no rival never withdraws, and the candidate
waits for it until it is marked won (the winner logs its params as its job is opened; at once
when other claims of its batch wait). A candidate waits only for the rivals of its first look,
and every rival it waits for has a later key, so no two candidates wait for each other.

A lost claim's run is ended KILLED, tagged ``furcate.claim=lost to <run>`` and deleted: MLflow's
UI hides it, and no later skip or resume decision counts it, since lookups read active runs only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from furcate_hydra.store.run_record import RunRecord, Tags

__all__ = ["WON", "Claim", "ClaimRequest", "Verdict", "has_won", "judge"]

WON = "won"  # the value of Tags.CLAIM on the run of a launcher that holds its config


@dataclass(frozen=True)
class ClaimRequest:
    """A config a launcher means to run: its new run's name and tags, or the interrupted run
    it would resume (then the claim is a stand-in run, deleted once the resumed run is open)."""

    fingerprint: str
    run_name: str
    tags: Mapping[str, str]
    params: Mapping[str, str]
    resumes: RunRecord | None = None


@dataclass
class Claim:
    """A claim's run and, once checked, the run that holds the config if not this one;
    ``opened``: the job's run (the new one, or the resumed one) once the claim is marked won."""

    request: ClaimRequest
    run: RunRecord
    holder: RunRecord | None = None
    opened: str | None = None

    @property
    def won(self) -> bool:
        return self.holder is None


@dataclass(frozen=True)
class Verdict:
    """Lost to ``holder``; undecided while ``waiting_for`` rivals may still withdraw; else won."""

    holder: RunRecord | None = None
    waiting_for: frozenset[str] = frozenset()

    @property
    def won(self) -> bool:
        return self.holder is None and not self.waiting_for


def judge(
    mine: RunRecord, rivals: Sequence[RunRecord], waiting_for: frozenset[str] | None
) -> Verdict:
    """The claim ``mine`` against the live RUNNING runs of its config (``rivals``, without
    ``mine``). ``waiting_for``: None at the first look, then the rivals still waited for."""
    won = sorted((r for r in rivals if has_won(r)), key=_order)
    if won:
        return Verdict(holder=won[0])
    if waiting_for is None:
        if not rivals:
            return Verdict()
        first = min(rivals, key=_order)
        if _order(first) < _order(mine):
            return Verdict(holder=first)
        return Verdict(waiting_for=frozenset(r.run_id for r in rivals))
    return Verdict(waiting_for=frozenset(r.run_id for r in rivals if r.run_id in waiting_for))


def has_won(record: RunRecord) -> bool:
    """Whether a RUNNING run's launcher won its claim (read from a lookup of RUNNING runs)."""
    return record.params_logged or record.tags.get(Tags.CLAIM) == WON


def _order(record: RunRecord) -> tuple[int, str]:
    return record.start_time_ms, record.run_id
