"""The launcher's per-job resource trace: memory, CPU and GPU use of each job's processes.

Sampled by the launcher on a thread of its own (``ResourceTracer``), written to each job's
``trace.csv`` and ``plots/resource_trace.png``, and sent to a ``TraceSink`` (the job's MLflow
run). ``PackingWatch`` reads the packed GPUs twice a second for ``jobs_per_gpu=auto``, apart
from the trace. Imports no Hydra and no MLflow; psutil always, NVML and matplotlib only when
used.
"""

from __future__ import annotations

from furcate_hydra.tracing.samples import METRIC_PREFIX, TracePeaks, TraceSample
from furcate_hydra.tracing.tracer import MetricRow, ResourceTracer, TraceSink

__all__ = ["METRIC_PREFIX", "MetricRow", "ResourceTracer", "TracePeaks", "TraceSample", "TraceSink"]
