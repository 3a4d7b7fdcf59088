"""Tests for GPU discovery and CUDA_VISIBLE_DEVICES parsing."""

from __future__ import annotations

import pytest

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.execution.gpu.devices import (
    InstalledGpu,
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
def test_nvml_probe_without_nvml_cannot_tell_what_is_installed() -> None:
    assert NvmlProbe().installed() is None


class FakeNvml:
    """NVML's answers for two GPUs (the library itself is real; only its calls are replaced)."""

    uuids = (UUID, "GPU-1b2c3d4e-aaaa-bbbb-cccc-0123456789ab")

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail_at: int | None = None) -> None:
        import pynvml

        self.open = 0
        self.fail_at = fail_at
        monkeypatch.setattr(pynvml, "nvmlInit", self.init)
        monkeypatch.setattr(pynvml, "nvmlShutdown", self.shutdown)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: len(self.uuids))
        monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda index: index)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetUUID", self.uuid)

    def init(self) -> None:
        self.open += 1

    def shutdown(self) -> None:
        self.open -= 1

    def uuid(self, handle: int) -> str:
        import pynvml

        if handle == self.fail_at:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return self.uuids[handle]


def test_nvml_probe_lists_installed_gpus_by_index_and_uuid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nvml = FakeNvml(monkeypatch)
    assert NvmlProbe().installed() == [
        InstalledGpu("0", FakeNvml.uuids[0]),
        InstalledGpu("1", FakeNvml.uuids[1]),
    ]
    assert nvml.open == 0  # shut down again


def test_nvml_probe_that_cannot_list_every_gpu_says_it_cannot_tell(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nvml = FakeNvml(monkeypatch, fail_at=1)
    assert NvmlProbe().installed() is None
    assert nvml.open == 0


@pytest.mark.parametrize(
    ("device", "named"),
    [("0", True), ("1", False), (UUID, True), (UUID[:12], True), ("GPU-0000", False)],
)
def test_an_installed_gpu_is_named_by_its_index_uuid_or_uuid_prefix(
    device: str, named: bool
) -> None:
    assert InstalledGpu("0", UUID).is_named_by(device) is named


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
    installed = probe.installed()
    assert installed is not None and [gpu.index for gpu in installed] == ids
    assert all(gpu.uuid.startswith("GPU-") for gpu in installed)

    import pynvml

    pynvml.nvmlInit()
    try:
        uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
    finally:
        pynvml.nvmlShutdown()
    assert probe.free_memory_bytes(str(uuid)) > 0
    # CUDA accepts a UUID prefix, so the probe must too.
    assert probe.free_memory_bytes(str(uuid)[:12]) > 0
