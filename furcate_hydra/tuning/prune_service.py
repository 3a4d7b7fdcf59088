"""The sweeper decides whether a trial stops: its jobs report to it, not to the study's storage.

    job (OptunaPruning)  ── POST /report {"trial": 7, "step": 3, "value": 0.41} ──►
                            Authorization: Bearer <trial 7's token>
    sweeper (PruneService, a thread of its process, 127.0.0.1)
        trial.report(value, step); trial.should_prune() on the sweeper's study ──► {"prune": …}

Every trial's job is a fresh process. Reporting to the storage itself, its first
``should_prune`` loads the whole study: Optuna's cached storage reads every trial once per
process, 18 s on PostgreSQL and 25-43 s on sqlite a job at 50,000 trials (docs/benchmarks.md,
"Optuna at 50,000 trials"). The sweeper holds the study already, read once and kept current
as it asks and tells, so the same decision there costs the trial's own rows. The job also
opens no database connection of its own.

Jobs on this machine only (loopback): jobs on a Ray cluster's nodes report to the storage or
its gRPC proxy as before. Any local user reaches a loopback port, so a report is taken only
with its trial's token: an HMAC of the trial's number under a key the service makes for its
sweep, handed to that trial's job in its environment (``FURCATE_OPTUNA_PRUNE_TOKEN``). A
job's token speaks for its own trial alone, and a trial the service was not given is refused
whatever is sent. Imports Optuna only; stdlib HTTP, nothing to install.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import optuna

from furcate_hydra import env_vars
from furcate_hydra.said_once import SaidOnce
from furcate_hydra.tuning.optuna_private import trial_id

__all__ = ["REPORT_PATH", "PruneService"]

log = logging.getLogger(__name__)

REPORT_PATH = "/report"
_LOOPBACK = "127.0.0.1"
_BEARER = "Bearer "
# a report is a few numbers: a longer body is not one, and is not read
_MAX_BODY = 4096


class PruneService:
    """Answers the jobs of the trials ``add``-ed, until ``stop``: report each epoch's value to
    the trial and say whether the study's pruner stops it. ``url`` is what jobs are given.

    It listens from the start but serves from ``serve``, or the first ``add``: its thread
    starts then, so that the launcher can still fork its server from this process before (a
    fork copies one thread, so the launcher forks only where no other runs)."""

    def __init__(self) -> None:
        self._trials: dict[int, optuna.Trial] = {}
        self._lock = threading.Lock()  # one decision at a time: each takes milliseconds
        self._key = secrets.token_bytes(32)  # this sweep's: its trials' tokens derive from it
        self._refused = SaidOnce()  # trials a refused report named
        server = ThreadingHTTPServer((_LOOPBACK, 0), _handler_for(self))
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="furcate-prune-service", daemon=True
        )
        self.url = f"http://{_LOOPBACK}:{server.server_address[1]}{REPORT_PATH}"

    def serve(self) -> None:
        """Answer reports from now on (once; reports sent before wait to be answered)."""
        with self._lock:
            if self._thread.ident is None:  # not started yet
                self._thread.start()

    def add(self, trial: optuna.Trial) -> None:
        """A trial whose job may report from now on."""
        with self._lock:
            self._trials[trial.number] = trial
        self.serve()

    def token(self, number: int) -> str:
        """The token trial ``number``'s job sends with each report (a secret of the job's)."""
        return hmac.new(self._key, f"trial {number}".encode(), hashlib.sha256).hexdigest()

    def admits(self, number: int, authorization: str | None) -> bool:
        """Whether a report for trial ``number`` carries its token; a refusal is logged once
        per trial it named."""
        expected = f"{_BEARER}{self.token(number)}".encode()
        if authorization and hmac.compare_digest(authorization.encode(), expected):
            return True
        if self._refused.first(number):
            log.warning(
                "furcate_optuna: refused a report for trial %d to the prune service: %s "
                "(later ones for it are refused without a word)",
                number,
                "it carried no token" if not authorization else "its token is not that trial's",
            )
        return False

    def discard(self, trial: optuna.Trial) -> None:
        """A trial told (or given up): its job reports no more."""
        with self._lock:
            self._trials.pop(trial.number, None)

    def report(self, number: int, step: int, value: float) -> bool:
        """Report ``value`` at ``step`` to trial ``number`` (a step reported before is kept as
        it was, as Optuna does); whether the pruner stops the trial now.

        Raises:
            KeyError: Trial ``number`` is not running in this sweep.
        """
        with self._lock:
            trial = self._trials[number]
            storage, key = trial.storage, trial_id(trial)
            frozen = storage.get_trial(key)  # this trial's rows, not the study's
            if step not in frozen.intermediate_values:
                trial.report(value, step)
            prune = bool(trial.should_prune())  # a pruner may answer with numpy's bool
            if prune and env_vars.PRUNED_AT_EPOCH_ATTR not in frozen.system_attrs:
                storage.set_trial_system_attr(key, env_vars.PRUNED_AT_EPOCH_ATTR, step)
        return prune

    def stop(self) -> None:
        if self._thread.ident is not None:  # shutdown() waits for a serve_forever that never began
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()


def _handler_for(service: PruneService) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if self.path != REPORT_PATH:
                self._answer(404, {"error": f"no such path {self.path!r}"})
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
                if not 0 <= length <= _MAX_BODY:
                    raise ValueError(f"a body of {length} bytes")
                body: dict[str, Any] = json.loads(self.rfile.read(length))
                number, step = int(body["trial"]), int(body["step"])
                value = float(body["value"])
            except (ValueError, KeyError, TypeError) as exc:
                self._answer(400, {"error": f"a report is {{trial, step, value}}: {exc!r}"})
                return
            if not service.admits(number, self.headers.get("Authorization")):
                self._answer(401, {"error": f"not trial {number}'s token"})
                return
            try:
                prune = service.report(number, step, value)
            except KeyError:
                self._answer(404, {"error": f"trial {number} is not running in this sweep"})
                return
            except Exception as exc:  # the storage's error, for the job to name
                log.warning("furcate_optuna: trial %d's report failed: %r", number, exc)
                self._answer(500, {"error": repr(exc)})
                return
            self._answer(200, {"prune": prune})

        def _answer(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # a line per epoch of every job is noise in the sweep's log

    return Handler
