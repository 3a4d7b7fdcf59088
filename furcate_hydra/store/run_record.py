"""What the store keeps about a job: tag names, run states, and the recorded return value."""

from __future__ import annotations

import base64
import enum
import io
import json
import math
import pickle
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = [
    "RETURN_VALUE_ARTIFACT",
    "RunRecord",
    "RunStatus",
    "Tags",
    "decode_return_value",
    "display_return_value",
    "encode_return_value",
]

# MLflow refuses tag values longer than this (mlflow.utils.validation.MAX_TAG_VAL_LENGTH).
MAX_TAG_VALUE = 8000
# A return value too big for a tag is logged as this artifact; the tag then says so.
RETURN_VALUE_ARTIFACT = "furcate/return_value.pkl"


class RunStatus(enum.Enum):
    """MLflow's run states, as furcate uses them."""

    RUNNING = "RUNNING"
    SCHEDULED = "SCHEDULED"
    FINISHED = "FINISHED"  # the task returned; its value is recorded
    FAILED = "FAILED"  # the task raised, exited, or its process crashed
    KILLED = "KILLED"  # the launcher stopped it (Ctrl-C, SIGTERM); resumable

    @classmethod
    def parse(cls, text: str) -> RunStatus:
        return cls(text) if text in cls._value2member_map_ else cls.FAILED


class Tags:
    """Tag keys furcate writes on runs; one place so readers and writers agree."""

    FINGERPRINT = "furcate.fingerprint"
    OVERRIDES = "furcate.overrides"
    JOB_NUM = "furcate.job_num"
    OUTPUT_DIR = "furcate.output_dir"
    CHECKPOINT_DIR = "furcate.checkpoint_dir"
    HOST = "furcate.host"
    BOOT_ID = "furcate.boot_id"
    LAUNCHER_PID = "furcate.launcher_pid"
    LAUNCHER_STARTED = "furcate.launcher_started"
    RETURN_VALUE = "furcate.return_value"
    ERROR = "furcate.error"
    RESUMED = "furcate.resumed"
    PREEMPTIONS = "furcate.preemptions"  # times the job was preempted and queued again
    SLURM_JOB = "furcate.slurm_job"  # the Slurm job its launcher ran in (12, or 12_3)
    SLURM_NODE = "furcate.slurm_node"  # ... and that job's node
    ROLE = "furcate.role"
    HEARTBEAT = "furcate.heartbeat"
    SWEEP_DIR = "furcate.sweep_dir"
    CODE_VERSION = "furcate.code_version"  # see store/code_version.py
    # written by the Optuna sweeper on a trial's run (its TrialTags): the trial's final state
    OPTUNA_STATE = "optuna.state"
    CLAIM = "furcate.claim"  # "won": the run's launcher holds its config (store/claims.py)
    PARENT_RUN = "mlflow.parentRunId"
    RUN_NAME = "mlflow.runName"


@dataclass(frozen=True)
class RunRecord:
    """One recorded run of a config, as read back from the store."""

    run_id: str
    fingerprint: str
    status: RunStatus
    start_time_ms: int
    tags: dict[str, str]
    # whether the run's params are logged (read for RUNNING runs: a claim that logged them won)
    params_logged: bool = False

    @property
    def parent_run_id(self) -> str | None:
        return self.tags.get(Tags.PARENT_RUN)

    @property
    def output_dir(self) -> str | None:
        return self.tags.get(Tags.OUTPUT_DIR)

    @property
    def checkpoint_dir(self) -> str | None:
        return self.tags.get(Tags.CHECKPOINT_DIR)

    @property
    def has_return_value(self) -> bool:
        return Tags.RETURN_VALUE in self.tags


def encode_return_value(value: Any) -> str | None:
    """Text for the return-value tag, or None when the value only fits in an artifact.

    JSON when the value survives a JSON round trip unchanged (numbers, strings, plain
    lists and dicts); otherwise a base64 pickle, so a skipped job returns exactly what the
    task returned (a tuple stays a tuple, a numpy float stays one).
    """
    try:
        text = json.dumps(value, allow_nan=True)
        if _same(json.loads(text), value):
            encoded = "json:" + text
            if len(encoded) <= MAX_TAG_VALUE:
                return encoded
    except (TypeError, ValueError):
        pass
    try:
        data = pickle.dumps(value)
    except Exception:  # the task returned something unpicklable: it is recorded as its repr
        return "repr:" + repr(value)[: MAX_TAG_VALUE - 5]
    encoded = "pickle:" + base64.b64encode(data).decode("ascii")
    return encoded if len(encoded) <= MAX_TAG_VALUE else None


def decode_return_value(text: str) -> Any:
    """Inverse of ``encode_return_value``; a ``repr:`` record comes back as that text."""
    kind, _, body = text.partition(":")
    if kind == "json":
        return json.loads(body)
    if kind == "pickle":
        return pickle.loads(base64.b64decode(body))
    if kind == "repr":
        return body
    raise ValueError(f"unknown return-value record {text[:40]!r}")


def display_return_value(text: str) -> Any:
    """The recorded value for a person to read, without running code from the store.

    ``decode_return_value`` unpickles, which can run anything the pickle names; a reader of
    someone else's store (``furcate status`` on a shared server) must not. Here a pickle is
    read only when it holds plain Python values and numpy scalars or arrays (a task returning
    ``np.float64``); anything else comes back as text saying what it is.
    """
    kind, _, body = text.partition(":")
    if kind == "pickle":
        try:
            return _PlainUnpickler(io.BytesIO(base64.b64decode(body))).load()
        except Exception as exc:
            return f"<pickled value: {exc}>"
    if kind == "artifact":
        return f"<pickled value in the run's artifact {body}>"
    try:
        return decode_return_value(text)
    except ValueError:
        return text


class _PlainUnpickler(pickle.Unpickler):
    """Builds builtins' containers and numpy scalars/arrays only."""

    _ALLOWED: ClassVar[set[tuple[str, str]]] = {
        ("builtins", "complex"),
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("builtins", "slice"),
        ("numpy", "dtype"),
        ("numpy", "ndarray"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("collections", "OrderedDict"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"holds a {module}.{name}, not read here")


def _same(decoded: Any, original: Any) -> bool:
    if type(decoded) is not type(original):
        return False
    if isinstance(original, float) and math.isnan(original):
        return math.isnan(decoded)
    if isinstance(original, list):
        return len(decoded) == len(original) and all(map(_same, decoded, original))
    if isinstance(original, dict):
        return (
            all(isinstance(k, str) for k in original)
            and decoded.keys() == original.keys()
            and all(_same(decoded[k], original[k]) for k in original)
        )
    return bool(decoded == original)
