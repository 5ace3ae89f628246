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
