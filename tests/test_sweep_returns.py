"""A sweep's JobReturns kept on disk: handed back whole, in job order, without holding them."""

from __future__ import annotations

import gc
import pickle
import weakref

import pytest
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from furcate_hydra.sweepers.sweep_returns import SweepReturns


def job_return(
    num: int, value: object = None, status: JobStatus = JobStatus.COMPLETED
) -> JobReturn:
    ret = JobReturn(
        overrides=[f"+i={num}"],
        cfg=OmegaConf.create({"i": num, "model": {"width": 8 * num}}),
        hydra_cfg=OmegaConf.create({"hydra": {"job": {"num": num, "name": "app"}}}),
        working_dir=f"/sweep/{num}",
        task_name="app",
        status=status,
    )
    ret.return_value = {"loss": num / 10} if value is None else value
    return ret


def failed(num: int) -> JobReturn:
    error = ValueError(f"job {num} failed")
    error.__cause__ = RuntimeError(f"traceback of job {num}")
    return job_return(num, error, JobStatus.FAILED)


def test_returns_come_back_whole_in_job_order_and_in_batches() -> None:
    returns = SweepReturns()
    for num in [3, 0, 4, 1, 2]:
        returns.add(num, job_return(num))
    batches = returns.batches(2)
    assert [len(batch) for batch in batches] == [2, 2, 1]
    flat = [ret for batch in batches for ret in batch]
    assert flat == [job_return(num) for num in range(5)]
    assert flat[4].cfg == {"i": 4, "model": {"width": 32}}
    hydra_cfg = flat[4].hydra_cfg
    assert hydra_cfg is not None and hydra_cfg.hydra.job.num == 4
    assert flat[4].return_value == {"loss": 0.4}
    assert batches[0][-1].overrides == ["+i=1"] and batches[0][0:2] == flat[0:2]
    with pytest.raises(IndexError):
        batches[2][1]
    (whole,) = returns.batches(None)
    assert list(whole) == flat
    # pickled (e.g. sent to another process), a batch is a plain list
    assert pickle.loads(pickle.dumps(whole)) == flat


def test_no_jobs_make_one_empty_batch_as_hydra_returns() -> None:
    assert SweepReturns().batches(4) == [[]]


def test_a_kept_return_holds_nothing_in_memory() -> None:
    returns = SweepReturns()
    ret = job_return(0)
    cfg = weakref.ref(ret.cfg)
    kept = weakref.ref(ret)
    returns.add(0, ret)
    del ret
    gc.collect()
    assert kept() is None and cfg() is None
    assert returns.batches(1)[0][0].cfg == {"i": 0, "model": {"width": 0}}


def test_failures_counted_the_first_in_job_order_kept_with_its_cause() -> None:
    returns = SweepReturns()
    for num in [9, 7, 1, 8, 2, 6, 5, 3]:
        returns.add(num, failed(num) if num != 2 else job_return(num))
    assert returns.failed == 7
    assert returns.failures_named() == [
        "#1 (+i=1)",
        "#3 (+i=3)",
        "#5 (+i=5)",
        "#6 (+i=6)",
        "#7 (+i=7)",
    ]
    first = returns.first_failure()
    assert first is not None and first.overrides == ["+i=1"]
    with pytest.raises(ValueError, match="job 1 failed") as raised:
        _ = first.return_value
    assert str(raised.value.__cause__) == "traceback of job 1"
    # read back from disk, a failed job's error keeps the job's own traceback as its cause
    again = returns.batches(None)[0][0]._return_value
    assert isinstance(again, ValueError) and str(again.__cause__) == "traceback of job 1"


def test_a_value_of_a_class_pickle_cannot_find_is_kept() -> None:
    class Result:  # defined here: plain pickle cannot pickle it by reference
        def __init__(self, loss: float) -> None:
            self.loss = loss

    returns = SweepReturns()
    returns.add(0, job_return(0, Result(0.5)))
    assert returns.batches(None)[0][0].return_value.loss == 0.5


def test_a_return_no_pickler_takes_is_kept_in_memory() -> None:
    """An in-process launcher (Hydra's basic one) can hand back any value."""
    returns = SweepReturns()
    returns.add(1, job_return(1))
    generator = (i for i in range(3))
    returns.add(0, job_return(0, generator))
    first, second = returns.batches(None)[0]
    assert first.return_value is generator and second.return_value == {"loss": 0.1}
