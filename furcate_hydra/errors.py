"""Errors raised for bad options and for jobs that did not complete."""

from __future__ import annotations

__all__ = ["ForkServerError", "FurcateConfigError", "JobCrashedError"]


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


class JobCrashedError(RuntimeError):
    """A job's process ended without reporting a result (signal, os._exit, native crash)."""


class ForkServerError(RuntimeError):
    """The warm fork server could not start or stopped answering."""
