"""One line per failed job, from the texts the launcher records (the crash matrix's real texts
are checked end to end in test_cli_status.py)."""

from __future__ import annotations

import os
import signal

import pytest

from furcate_hydra.execution.exits import describe_wait_status
from furcate_hydra.reasons import MAX_REASON, interrupted_reason, one_line_reason, pruned_reason

LOGS = "\nSee the job's logs: /s/0/stdout.log and /s/0/stderr.log"


def crashed(state: str, why: str) -> str:
    """As the run ledger writes a JobCrashedError: its type, the job, its state, the reason."""
    return f"JobCrashedError: Job #3 (lr=0.1 model=a) {state}: {why}{LOGS}"


def killed_by(signum: signal.Signals) -> str:
    # a waitpid status for a process killed by ``signum`` (no core dump)
    status = int(signum)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signum
    return crashed("crashed", describe_wait_status(status))


def exited_with(code: int) -> str:
    status = code << 8
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == code
    return crashed("crashed", describe_wait_status(status))


@pytest.mark.parametrize(
    "error, reason",
    [
        ("ValueError: lr must be positive", "ValueError: lr must be positive"),
        ("KeyError: 'x'\n\nmore lines of the message", "KeyError: 'x'"),
        (killed_by(signal.SIGKILL), "killed by SIGKILL"),
        (killed_by(signal.SIGSEGV), "segfault (SIGSEGV)"),
        (killed_by(signal.SIGABRT), "abort (SIGABRT)"),
        (killed_by(signal.SIGBUS), "bus error (SIGBUS)"),
        (killed_by(signal.SIGTERM), "killed by SIGTERM"),
        (exited_with(7), "os._exit(7)"),
        (crashed("failed", "the job called sys.exit(3)"), "sys.exit(3)"),
        (crashed("failed", "the job called sys.exit('bad config')"), "sys.exit('bad config')"),
        ("launcher stopped", "stopped by the launcher"),
        (crashed("cancelled", "stopped by the launcher"), "stopped by the launcher"),
        (
            crashed("lost", "The fork server stopped unexpectedly (exit status -9)"),
            "lost: the fork server stopped unexpectedly (exit status -9)",
        ),
        (
            crashed("failed", "the job's return value of type generator could not be pickled"),
            "the job's return value of type generator could not be pickled",
        ),
    ],
)
def test_a_recorded_error_becomes_its_one_line_reason(error: str, reason: str) -> None:
    assert one_line_reason(error) == reason


def test_a_tasks_own_message_that_names_a_signal_stays_the_tasks_message() -> None:
    error = "RuntimeError: the data loader was killed by SIGKILL"
    assert one_line_reason(error) == error


def test_no_error_is_no_reason_and_a_long_one_is_cut() -> None:
    assert one_line_reason(None) is None and one_line_reason("  \n") is None
    reason = one_line_reason("ValueError: " + "x" * 1000)
    assert reason is not None and len(reason) == MAX_REASON and reason.endswith("…")


def test_pruned_and_interrupted_reasons() -> None:
    assert pruned_reason(4) == "pruned at epoch 4"
    assert pruned_reason(None) == "pruned"
    assert interrupted_reason("its launcher has exited") == "interrupted: its launcher has exited"
