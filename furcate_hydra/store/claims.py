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

    ConfigClaims.claim(requests) ──► write: a RUNNING run per config (a stand-in to resume one)
                                 ──► settle: one lookup of rivals per look, ``judge`` each claim
    ConfigClaims.confirm(claim)  ──► marked won: the job's run (new, or the resumed one)
    ConfigClaims.withdraw(claim) ──► a claim whose job never started: KILLED, deleted
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from furcate_hydra.store.liveness import Gone
from furcate_hydra.store.lookup import find_runs
from furcate_hydra.store.run_record import RunRecord, RunStatus, Tags

__all__ = [
    "CLAIM_LOOK_S",
    "CLAIM_PATIENCE_S",
    "WON",
    "Claim",
    "ClaimRequest",
    "ClaimsStore",
    "ConfigClaims",
    "Verdict",
    "has_won",
    "judge",
]

log = logging.getLogger(__name__)

WON = "won"  # the value of Tags.CLAIM on the run of a launcher that holds its config
# A claim waits this long between looks for the rivals it saw to withdraw (they do at once).
CLAIM_LOOK_S = 0.05
# ... and at most this long in all; then it withdraws itself (always safe: see above).
CLAIM_PATIENCE_S = 30.0


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


class ClaimsStore(Protocol):
    """What claims need of the store they are carried out in (``RunStore`` is one): the
    protocol sits below the gateway, not beside it in a circle."""

    client: Any  # MlflowClient: MLflow is imported only once a store opens
    experiment_id: str
    artifact_uris: dict[str, str]

    def job_run_tags(self, tags: Mapping[str, str]) -> dict[str, str]: ...

    def set_job_tags(self, run_id: str, tags: Mapping[str, str]) -> None: ...

    def liveness(self, records: Iterable[RunRecord]) -> Gone: ...


class ConfigClaims:
    """One launcher's claims, carried out on the runs of its store (one thread uses it)."""

    def __init__(self, store: ClaimsStore) -> None:
        self._store = store

    def claim(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        """Claim each config before its job starts: a RUNNING run each, then one lookup of the
        rivals for all of them. Lost claims are withdrawn, each naming the run that holds its
        config; won ones are to be ``confirm``-ed (here already, when other claims had to wait:
        a winner marked late would keep other launchers waiting)."""
        claims: list[Claim] = []
        try:
            for request in requests:
                claims.append(self.write(request))
            self.settle(claims)
        except BaseException:
            for claim in claims:
                if claim.opened is None:
                    self._withdraw_quietly(claim)
            raise
        return claims

    def write(self, request: ClaimRequest) -> Claim:
        """The claim's run, RUNNING, not yet checked against rivals (``settle``)."""
        store = self._store
        if request.resumes is None:
            name, tags = request.run_name, store.job_run_tags(request.tags)
        else:  # a stand-in: the resumed run itself is one row, which claims cannot share
            name = f"claim: {request.run_name}"
            own = {Tags.FINGERPRINT: request.fingerprint, Tags.ROLE: "claim"}
            tags = store.job_run_tags(own)
        run = store.client.create_run(store.experiment_id, run_name=name, tags=tags)
        store.artifact_uris[run.info.run_id] = run.info.artifact_uri
        record = RunRecord(
            run.info.run_id, request.fingerprint, RunStatus.RUNNING, run.info.start_time, tags
        )
        return Claim(request, record)

    def settle(self, claims: list[Claim]) -> None:
        """Look at the rivals of every claim (one lookup) until each has won or lost."""
        store = self._store
        waiting: dict[str, frozenset[str] | None] = {c.run.run_id: None for c in claims}
        undecided = list(claims)
        deadline = time.monotonic() + CLAIM_PATIENCE_S
        while undecided:
            fingerprints = {c.request.fingerprint for c in undecided}
            found = find_runs(store.client, store.experiment_id, fingerprints, running_only=True)
            gone = store.liveness(r for runs in found.values() for r in runs)
            still: list[Claim] = []
            for claim in undecided:
                rivals = [
                    r
                    for r in found.get(claim.request.fingerprint, [])
                    if r.run_id != claim.run.run_id and gone(r) is None
                ]
                verdict = judge(claim.run, rivals, waiting[claim.run.run_id])
                if verdict.holder is not None:
                    self._lose(claim, verdict.holder)
                elif verdict.waiting_for:
                    if time.monotonic() > deadline:
                        self._lose(claim, _earliest(rivals, verdict))
                        continue
                    waiting[claim.run.run_id] = verdict.waiting_for
                    still.append(claim)
            if still:
                # winners first: a rival of theirs may be waiting for the mark
                waits = {id(c) for c in still}
                for claim in claims:
                    if claim.won and id(claim) not in waits and claim.opened is None:
                        self.confirm(claim)
                time.sleep(CLAIM_LOOK_S)
            undecided = still

    def confirm(self, claim: Claim) -> str:
        """The job's run of a won claim, marked won: the new run with its params, or the
        interrupted run RUNNING again under this launcher (its stand-in deleted)."""
        from mlflow.entities import Param, RunTag

        assert claim.won, "only a won claim opens a run"
        if claim.opened is not None:
            return claim.opened
        store = self._store
        request, run_id = claim.request, claim.run.run_id
        resumed = request.resumes
        if resumed is None:
            # The params mark the claim won; a tag does where there are none (a tag in the same
            # log_batch costs as much as the params of a small config on sqlite).
            # log_batch splits into MLflow's per-request limits itself.
            params = [Param(k, v) for k, v in request.params.items()]
            mark = [] if params else [RunTag(Tags.CLAIM, WON)]
            store.client.log_batch(run_id, params=params, tags=mark)
            claim.opened = run_id
            return run_id
        # RUNNING, then the tags that name this launcher: the other way round, a lookup in
        # between would take it for the stopped run's
        store.client.update_run(resumed.run_id, status=RunStatus.RUNNING.value)
        count = int(resumed.tags.get(Tags.RESUMED, "0") or 0) + 1
        tags = {**store.job_run_tags(request.tags), Tags.RESUMED: str(count), Tags.CLAIM: WON}
        store.set_job_tags(resumed.run_id, tags)
        store.client.delete_run(run_id)  # the stand-in, after: a claim is visible throughout
        store.artifact_uris.pop(run_id, None)
        claim.opened = resumed.run_id
        return resumed.run_id

    def withdraw(self, claim: Claim) -> None:
        """Give up a claim not confirmed (the launcher stops before its job started)."""
        if claim.opened is None:
            self._withdraw_quietly(claim)

    def _lose(self, claim: Claim, holder: RunRecord) -> None:
        claim.holder = holder
        self._withdraw_quietly(claim)

    def _withdraw_quietly(self, claim: Claim) -> None:
        """End the claim's run KILLED, say why, delete it: out of the UI and of every lookup.
        A failure here is logged: a run left RUNNING by a launcher counts as its (gone) claim."""
        client, run_id = self._store.client, claim.run.run_id
        why = f"lost to {claim.holder.run_id}" if claim.holder is not None else "withdrawn"
        try:
            client.set_tag(run_id, Tags.CLAIM, why)
            client.set_terminated(run_id, RunStatus.KILLED.value)
            client.delete_run(run_id)
        except Exception as exc:
            log.warning("furcate: could not withdraw the claim of run %s: %s", run_id, exc)
        self._store.artifact_uris.pop(run_id, None)


def _earliest(rivals: Sequence[RunRecord], verdict: Verdict) -> RunRecord:
    waited = [r for r in rivals if r.run_id in verdict.waiting_for]
    return min(waited, key=_order)
