"""A sweep's JobReturns, kept on disk as they come back, read again only when asked for.

Hydra's ``Sweeper.sweep`` returns every job's JobReturn, and each one carries two whole configs
(``cfg``, and ``hydra_cfg`` at ~100 KB of OmegaConf nodes on its own): kept in memory, 10,000
jobs cost the launcher process ~1 GB for a value the command line throws away. The furcate
sweepers instead append each JobReturn, pickled and compressed, to an unlinked temporary file
and keep its offset; what ``sweep`` returns are batches that unpickle a job's JobReturn when
indexed. The sweeper keeps in memory only what it acts on: how many jobs failed, and the first
failures in job order (to name them, and to raise the first one's error as Hydra would).
"""

from __future__ import annotations

import heapq
import os
import pickle
import tempfile
import zlib
from array import array
from collections.abc import Iterator, Sequence
from typing import Any, overload

import cloudpickle
from hydra.core.utils import JobReturn, JobStatus

from furcate_hydra.hydra_api.private_names import returned

__all__ = ["ReturnBatch", "SweepReturns"]

# failed jobs named in the sweep's closing error line
_NAMED_FAILURES = 5


class SweepReturns:
    """``add(num, job_return)`` as jobs end; ``batches(size)`` in job order at the end."""

    def __init__(self) -> None:
        # Unlinked at once: it goes away with its last reader, or with the process.
        self._file = tempfile.TemporaryFile(prefix="furcate-returns-", buffering=0)  # noqa: SIM115
        self._size = 0
        self._nums = array("q")
        self._offsets = array("q")
        self._lengths = array("q")
        self.failed = 0
        # (-num, name): a max-heap of the lowest-numbered failures, to name them at the end
        self._named: list[tuple[int, str]] = []
        self._first_failure: tuple[int, JobReturn] | None = None
        # JobReturns no pickler takes (a generator an in-process launcher returned): their
        # entries have length -1 and their index here as offset
        self._unpicklable: list[JobReturn] = []

    def __len__(self) -> int:
        return len(self._nums)

    def add(self, num: int, job_return: JobReturn) -> None:
        """Keep job ``num``'s JobReturn (on disk unless it cannot be pickled)."""
        if job_return.status is JobStatus.FAILED:
            self._count_failure(num, job_return)
        value = returned(job_return)
        # pickle drops an exception's __cause__: the job's own traceback, kept apart
        cause = value.__cause__ if isinstance(value, BaseException) else None
        self._nums.append(num)
        try:
            blob = zlib.compress(_dumps((job_return, cause)), 1)
        except Exception:
            self._offsets.append(len(self._unpicklable))
            self._lengths.append(-1)
            self._unpicklable.append(job_return)
            return
        os.pwrite(self._file.fileno(), blob, self._size)
        self._offsets.append(self._size)
        self._lengths.append(len(blob))
        self._size += len(blob)

    def batches(self, size: int | None) -> list[ReturnBatch]:
        """Every JobReturn in job order, in batches of ``size`` (one batch for None);
        ``[[]]`` with no jobs, as Hydra's sweepers return."""
        order = sorted(range(len(self._nums)), key=self._nums.__getitem__)
        entries = [(self._offsets[i], self._lengths[i]) for i in order]
        size = size or max(len(entries), 1)
        chunks = [entries[i : i + size] for i in range(0, len(entries), size)] or [[]]
        return [
            ReturnBatch(self, array("q", [n for entry in chunk for n in entry])) for chunk in chunks
        ]

    def first_failure(self) -> JobReturn | None:
        """The failed JobReturn with the lowest job number, as it came back (in memory)."""
        return None if self._first_failure is None else self._first_failure[1]

    def failures_named(self) -> list[str]:
        """The first failed jobs in job order, ``#num (overrides)``."""
        return [name for _, name in sorted(self._named, reverse=True)]

    def read(self, offset: int, length: int) -> JobReturn:
        if length < 0:
            return self._unpicklable[offset]
        job_return, cause = pickle.loads(
            zlib.decompress(os.pread(self._file.fileno(), length, offset))
        )
        if cause is not None:
            returned(job_return).__cause__ = cause
        assert isinstance(job_return, JobReturn)
        return job_return

    def _count_failure(self, num: int, job_return: JobReturn) -> None:
        self.failed += 1
        overrides = " ".join(job_return.overrides or []) or "no overrides"
        heapq.heappush(self._named, (-num, f"#{num} ({overrides})"))
        if len(self._named) > _NAMED_FAILURES:
            heapq.heappop(self._named)
        if self._first_failure is None or num < self._first_failure[0]:
            self._first_failure = (num, job_return)


def _dumps(value: Any) -> bytes:
    try:
        return pickle.dumps(value, pickle.HIGHEST_PROTOCOL)  # C-fast, for what it can find
    except Exception:  # e.g. a value of a class cloudpickle brought from the job by value
        return bytes(cloudpickle.dumps(value, pickle.HIGHEST_PROTOCOL))


class ReturnBatch(Sequence[JobReturn]):
    """A batch of a sweep's JobReturns, each unpickled from the sweep's file when indexed
    (a fresh object each time); a list of them once pickled."""

    def __init__(self, returns: SweepReturns, entries: array[int]) -> None:
        self._returns = returns
        self._entries = entries  # offset, length, offset, length, ...

    def __len__(self) -> int:
        return len(self._entries) // 2

    @overload
    def __getitem__(self, index: int) -> JobReturn: ...

    @overload
    def __getitem__(self, index: slice) -> list[JobReturn]: ...

    def __getitem__(self, index: int | slice) -> JobReturn | list[JobReturn]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError(f"batch index {index} out of range ({len(self)} jobs)")
        index %= len(self)
        return self._returns.read(self._entries[2 * index], self._entries[2 * index + 1])

    def __iter__(self) -> Iterator[JobReturn]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ReturnBatch({len(self)} jobs)"

    def __reduce__(self) -> tuple[Any, ...]:
        return list, (list(self),)
