"""Tests for GPU discovery and CUDA_VISIBLE_DEVICES parsing."""

from __future__ import annotations

import pytest

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.execution.devices import (
    NvmlProbe,
    normalize_device_id,
    parse_cuda_visible_devices,
)

UUID = "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"
MIG = "MIG-7a2e1b1c-3d4e-5f60-7182-93a4b5c6d7e8"


def _nvml_available() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0", ["0"]),
        ("0,1", ["0", "1"]),
        (" 2 , 3 ", ["2", "3"]),
        ("1,0", ["1", "0"]),
        (f"{UUID},{MIG}", [UUID, MIG]),
        ("GPU-8932f937", ["GPU-8932f937"]),
        ("", []),
        ("   ", []),
        ("-1", []),
        ("0,-1,1", ["0"]),
    ],
)
def test_parse_cuda_visible_devices(value: str, expected: list[str]) -> None:
    assert parse_cuda_visible_devices(value) == expected


@pytest.mark.parametrize("value", ["a", "0,,1", "0,", "-2", "1.5", "gpu0", "GPU-", "0,0"])
def test_parse_cuda_visible_devices_rejects_bad_entries(value: str) -> None:
    with pytest.raises(FurcateConfigError) as info:
        parse_cuda_visible_devices(value)
    message = str(info.value)
    assert "CUDA_VISIBLE_DEVICES" in message
    assert repr(value) in message
    assert "Fix:" in message


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (0, "0"),
        (3, "3"),
        ("07", "7"),
        (f" {UUID} ", UUID),
        (MIG, MIG),
        (True, None),
        (-1, None),
        (1.0, None),
        ("", None),
        ("x1", None),
        (None, None),
    ],
)
def test_normalize_device_id(entry: object, expected: str | None) -> None:
    assert normalize_device_id(entry) == expected


@pytest.mark.skipif(_nvml_available(), reason="NVML is available here")
def test_nvml_probe_without_nvml_finds_no_device() -> None:
    assert NvmlProbe().device_ids() == []


@pytest.mark.skipif(_nvml_available(), reason="NVML is available here")
def test_nvml_probe_without_nvml_cannot_read_memory() -> None:
    with pytest.raises(RuntimeError, match="NVML is not available"):
        NvmlProbe().free_memory_bytes("0")


@pytest.mark.gpu
def test_nvml_probe_on_real_gpu() -> None:
    probe = NvmlProbe()
    ids = probe.device_ids()
    if not ids:
        pytest.skip("no NVIDIA GPU on this machine")
    assert ids == [str(i) for i in range(len(ids))]
    assert all(probe.free_memory_bytes(device) > 0 for device in ids)

    import pynvml

    pynvml.nvmlInit()
    try:
        uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
    finally:
        pynvml.nvmlShutdown()
    assert probe.free_memory_bytes(str(uuid)) > 0
    # CUDA accepts a UUID prefix, so the probe must too.
    assert probe.free_memory_bytes(str(uuid)[:12]) > 0
