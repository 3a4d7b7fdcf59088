"""Errors raised for bad options and for jobs that did not complete, and an error in a line."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "ExecutorBrokenError",
    "ForkServerError",
    "FurcateConfigError",
    "JobCrashedError",
    "PrivateApiMoved",
    "first_line",
    "name_list",
    "positive_seconds",
]


class FurcateConfigError(ValueError):
    """An option has a value we cannot use.

    The message always names the option, the bad value, what is allowed and how to fix it.
    """

    def __init__(self, key: str, value: object, problem: str, fix: str) -> None:
        self.key = key
        self.value = value
        self.problem = problem
        self.fix = fix
        super().__init__(f"Invalid {key}={value!r}: {problem}. Fix: {fix}.")


def positive_seconds(key: str, value: object, example: float) -> float:
    """``value`` as seconds, or a FurcateConfigError naming ``key`` (and ``example`` as a fix)
    when it is not > 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise FurcateConfigError(
            key, value, "must be a positive number of seconds", f"set e.g. {key}={example:g}"
        )
    return float(value)


def name_list(key: str, value: object, what: str, example: str) -> tuple[str, ...]:
    """``value`` as a tuple of non-empty strings, or an error naming ``key`` and an example."""
    items = [] if value is None else value
    if isinstance(items, str | bytes) or not isinstance(items, Sequence):
        items = [None]  # not a list: reported below like a bad entry
    if not all(isinstance(item, str) and item for item in items):
        raise FurcateConfigError(key, value, f"must be a list of {what}", f"set e.g. {example}")
    return tuple(str(item) for item in items)


class PrivateApiMoved(RuntimeError):
    """A release of a library no longer has a private name furcate reads (each library's
    private names are read in one adapter, which says which releases they come from)."""

    def __init__(self, library: str, dist: str, version: str, tested: str, name: str,
                 problem: str) -> None:  # fmt: skip
        super().__init__(
            f"furcate-hydra reads {library}'s private {name}, which {dist} {version} "
            f"{problem} (read from {dist} {tested}). Fix: install a {dist} of those "
            "releases, or a furcate-hydra that supports this one."
        )
        self.name = name


class JobCrashedError(RuntimeError):
    """A job's process ended without reporting a result (signal, os._exit, native crash)."""


class ForkServerError(RuntimeError):
    """The warm fork server could not start or stopped answering."""


class ExecutorBrokenError(RuntimeError):
    """The machinery that runs jobs died (the fork server): it takes no more jobs."""


def first_line(exc: BaseException) -> str:
    """An error's message in one line, for a sentence that names its cause: its first line,
    or its type where it has no message."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
