"""Which code a run ran: recorded with each run, so a rerun can tell a stale record.

The key runs are compared by:
    git:<commit>                     the task's module is in a clean git work tree
    git:<commit>+dirty:<sha256[:12]> uncommitted changes: the module's own hash tells edits apart
    module:<sha256>                  no git: the hash of the task's module file
MLflow's own ``mlflow.source.git.commit`` tag is written too, so ``mlflow ui`` shows the commit.
"""

from __future__ import annotations

import enum
import hashlib
import subprocess
from dataclasses import dataclass
from pathlib import Path

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.store.records import Tags

__all__ = ["CodeChange", "CodeVersion", "code_version"]

# git on a network file system can hang; the sweep must not.
_GIT_TIMEOUT_S = 5.0


class CodeChange(enum.Enum):
    """What a FINISHED run recorded by other code means (``hydra.launcher.code_change``)."""

    RERUN = "rerun"  # it does not count: the config runs again, in a new run
    WARN = "warn"  # it counts; the sweep says in one line how many skipped runs are stale
    IGNORE = "ignore"  # it counts, silently

    @classmethod
    def parse(cls, value: object) -> CodeChange:
        for member in cls:
            if value == member.value:
                return member
        raise FurcateConfigError(
            "hydra.launcher.code_change",
            value,
            "must be one of rerun, warn, ignore",
            "set hydra.launcher.code_change=warn (skip what finished, say how much of it ran "
            "other code), rerun (run again what other code finished) or ignore",
        )


@dataclass(frozen=True)
class CodeVersion:
    key: str
    git_commit: str | None = None
    git_dirty: bool | None = None
    module_sha256: str | None = None

    def tags(self) -> dict[str, str]:
        """Tags for a job's run (``Tags.CODE_VERSION`` is the key; MLflow's commit tag)."""
        tags = {Tags.CODE_VERSION: self.key}
        if self.git_commit is not None:
            tags["mlflow.source.git.commit"] = self.git_commit
        return tags


def code_version(module_file: Path | None) -> CodeVersion | None:
    """The version of the code in ``module_file`` (the task's module); None when unknown."""
    if module_file is None or not module_file.is_file():
        return None
    digest = hashlib.sha256(module_file.read_bytes()).hexdigest()
    commit = _git(module_file.parent, "rev-parse", "HEAD")
    if commit is None:
        return CodeVersion(f"module:{digest}", module_sha256=digest)
    # tracked files only: an untracked output dir beside the code is no change of code
    dirty = bool(_git(module_file.parent, "status", "--porcelain", "--untracked-files=no"))
    key = f"git:{commit}+dirty:{digest[:12]}" if dirty else f"git:{commit}"
    return CodeVersion(key, commit, dirty, digest)


def _git(where: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(where), *args],
            capture_output=True,
            text=True,
            timeout=_GIT_TIMEOUT_S,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None  # no git, not a work tree, or too slow
    return done.stdout.strip()
