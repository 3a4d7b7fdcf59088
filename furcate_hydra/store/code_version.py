"""Which code a run ran: recorded with each run, so a rerun can tell a stale record.

What counts as code: each file git tracks in the work tree of the task's module, as it is on
disk (uncommitted edits included), and the task's module itself, tracked or not; but not the
Hydra config files (``.yaml``, ``.yml``) under the app's config dirs. A config file reaches a
job only through the job's composed config, which its fingerprint covers: an edit that changes
a job's config gives it a new fingerprint (it runs anew), one that does not (a new option in
a config group, a comment) leaves its result as it was. Any other tracked file may be read by
the task (a helper module, a native extension's source, a vocabulary file), and which ones are
cannot be told from here, so every one counts. Untracked files do not: outputs and logs beside
the code are no change of code.

The key runs are compared by:
    git-code:<sha256>  in a git work tree: the code files' paths and git blob ids, so the same
                       content is the same code, committed or not, whatever commit holds it
    module:<sha256>    no git: the hash of the task's module file
MLflow's own ``mlflow.source.git.commit`` tag is written too, so ``mlflow ui`` shows the commit.
"""

from __future__ import annotations

import enum
import hashlib
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.store.run_record import Tags

__all__ = ["CodeChange", "CodeVersion", "code_version"]

# git on a network file system can hang; the sweep must not.
_GIT_TIMEOUT_S = 5.0
# what Hydra reads a config from (.yml before version_base 1.2)
_CONFIG_SUFFIXES = (".yaml", ".yml")
# a tracked path whose content cannot be hashed as a file (deleted, a submodule's dir)
_NOT_A_FILE = "-"


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
    """The key runs are compared by, and what it was taken from.

    Attributes:
        key: ``git-code:<sha256>`` or ``module:<sha256>`` (see the module's docstring).
        git_commit: HEAD of the work tree, None without git.
        git_dirty: Whether a code file differs from HEAD (config files left out).
        module_sha256: The hash of the task's module file.
    """

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


def code_version(module_file: Path | None, config_dirs: Sequence[Path] = ()) -> CodeVersion | None:
    """The version of the code that runs the task in ``module_file``; None when unknown.

    Args:
        module_file: The task's module.
        config_dirs: The app's config dirs: their config files are not code.
    """
    if module_file is None or not module_file.is_file():
        return None
    digest = hashlib.sha256(module_file.read_bytes()).hexdigest()
    found = _code_files(module_file.resolve(), digest, [d.resolve() for d in config_dirs])
    if found is None:
        return CodeVersion(f"module:{digest}", module_sha256=digest)
    commit, blobs, dirty = found
    listing = "".join(f"{path}\0{blob}\n" for path, blob in sorted(blobs.items()))
    key = hashlib.sha256(listing.encode("utf-8", "surrogateescape")).hexdigest()
    return CodeVersion(f"git-code:{key}", commit, dirty, digest)


def _code_files(
    module: Path, digest: str, config_dirs: Sequence[Path]
) -> tuple[str, dict[str, str], bool] | None:
    """HEAD of the module's work tree, each code file's git blob id as it is on disk, and
    whether any differs from HEAD; None without git, or when git does not answer."""
    head = _git(module.parent, "rev-parse", "--show-toplevel", "HEAD")
    lines = head.splitlines() if head else []
    if len(lines) != 2:
        return None  # no git, not a work tree, or no commit yet
    top, commit = Path(lines[0]), lines[1]
    tree = _git(top, "ls-tree", "-r", "-z", "--full-tree", "HEAD")
    changed = _git(top, "diff", "HEAD", "--name-only", "-z", "--no-renames", "--no-ext-diff")
    if tree is None or changed is None or not module.is_relative_to(top):
        return None

    def code(path: str) -> bool:
        if not path.endswith(_CONFIG_SUFFIXES):
            return True
        return not any((top / path).is_relative_to(folder) for folder in config_dirs)

    blobs = {}
    for entry in filter(None, tree.split("\0")):
        meta, _, path = entry.partition("\t")
        if code(path):
            blobs[path] = meta.split()[2]
    edited = [path for path in filter(None, changed.split("\0")) if code(path)]
    on_disk = [p for p in edited if (top / p).is_file() and not (top / p).is_symlink()]
    # the blob id a commit would give: the same content is the same key, committed or not
    ids = _git(top, "hash-object", "--stdin-paths", stdin="\n".join(on_disk)) if on_disk else ""
    if ids is None:
        return None
    blobs.update(dict.fromkeys(edited, _NOT_A_FILE))
    blobs.update(zip(on_disk, ids.split(), strict=True))
    # an untracked task module is code all the same
    blobs.setdefault(module.relative_to(top).as_posix(), f"sha256:{digest}")
    return commit, blobs, bool(edited)


def _git(where: Path, *args: str, stdin: str | None = None) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(where), *args],
            input=stdin,
            capture_output=True,
            text=True,
            errors="surrogateescape",  # paths are bytes to git: any name is a name
            timeout=_GIT_TIMEOUT_S,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None  # no git, not a work tree, or too slow
    return done.stdout
