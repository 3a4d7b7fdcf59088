"""What a job's process is told of its slot, the same under every transport.

    local slot:  cuda_env(its GPUs) + slot_env(index, GPUs, threads)  ─► the job's Placement
    Ray slot:    cuda_env set once in the slot actor (Ray names its GPUs)
                 + slot_env(index, GPUs, threads)                     ─► the job's Placement

A job sees the same variables on either transport; only who names its GPUs differs.
"""

from __future__ import annotations

from furcate_hydra import env_vars

__all__ = ["THREAD_VARS", "VISIBLE_DEVICES", "cuda_env", "slot_env"]

VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
# The thread pools a job's libraries size from the environment (OpenMP, MKL, OpenBLAS).
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def cuda_env(visible: str | None) -> dict[str, str]:
    """CUDA's view of a slot's GPUs, to set before anything initialises CUDA: ``visible`` as
    ``CUDA_VISIBLE_DEVICES`` lists them ("0", "0,1", a UUID), None on CPU."""
    return {
        # "" rather than unset: a CPU slot must not be able to grab a GPU.
        VISIBLE_DEVICES: visible or "",
        # CUDA's default order is fastest-first; NVML indices (and Ray's) follow the PCI bus.
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }


def slot_env(index: int, gpus: int, threads: int | None) -> dict[str, str]:
    """The slot's index, its GPU count (what a job's Trainer may ask for) and, where the slot
    sets one, the threads each of the job's processes runs."""
    env = {"FURCATE_SLOT": str(index), env_vars.GPUS_PER_JOB: str(gpus)}
    if threads is not None:
        env.update(dict.fromkeys(THREAD_VARS, str(threads)))
    return env
