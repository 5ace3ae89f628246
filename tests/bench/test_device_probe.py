"""`fishserve probe` and the device probe: a fixed GPU workload, timed."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from fishserve.bench.device_probe import describe, device_probe
from fishserve.cli import app


def test_the_device_probe_needs_cuda() -> None:
    with pytest.raises(ValueError, match="needs a CUDA device"):
        device_probe(torch.device("cpu"))


def test_describe_marks_what_nvml_did_not_say() -> None:
    line = describe({"launch_us": 1.234, "gemm_tflops": 650.4, "sm_clock_mhz": None})
    assert "1.23 us per graph kernel" in line and "650 bf16 TFLOP/s" in line
    assert "SM clock ?/? MHz" in line


def test_cli_on_a_cpu_prints_the_host_probe_only() -> None:
    result = CliRunner().invoke(app, ["probe", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "host probe:" in result.output and "device probe" not in result.output


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_probe_gives_plausible_numbers() -> None:
    probe = device_probe(torch.device("cuda"))
    assert 0 < probe["launch_us"] < 100 and probe["gemm_tflops"] > 1


class _FakeNvml:
    NVML_CLOCK_SM, NVML_TEMPERATURE_GPU = 1, 0

    def __init__(self, known: set[str]) -> None:
        self.known, self.asked = known, []

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:  # noqa: N802 (NVML's names)
        self.asked.append(uuid)
        if uuid not in self.known:
            raise RuntimeError("not found")
        return uuid

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:  # noqa: N802
        self.asked.append(index)
        return f"index{index}"


@pytest.mark.parametrize("visible", [None, "3"])
def test_nvml_finds_the_cuda_device_by_uuid(monkeypatch, visible: str | None) -> None:
    """NVML numbers GPUs physically: with CUDA_VISIBLE_DEVICES=3, CUDA device 0 is NVML's 3."""
    from types import SimpleNamespace

    from fishserve.bench import device_probe as dp

    props = SimpleNamespace(uuid="abcd-1234")
    monkeypatch.setattr(dp.torch.cuda, "get_device_properties", lambda index: props)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    nvml = _FakeNvml({"GPU-abcd-1234"})
    assert dp._nvml_handle(nvml, 0) == "GPU-abcd-1234"
    props.uuid = "other"  # a UUID NVML does not know: the index only where both agree
    if visible is None:
        assert dp._nvml_handle(nvml, 0) == "index0"
    else:
        with pytest.raises(RuntimeError):
            dp._nvml_handle(nvml, 0)
