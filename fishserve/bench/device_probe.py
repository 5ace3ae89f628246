"""How fast this machine's GPU runs an engine's kind of work: two fixed probes, timed.

Leases of the same GPU model differ (docs/benchmarks.md §6.25: the same code served far fewer
streams on some), by their CPU (`fishserve.host_probe`) and possibly by their GPU's clocks or
power limit. This times, on a CUDA device:

* ``launch_us``: microseconds per kernel of a chain of `CHAIN` tiny kernels replayed from one
  CUDA graph: what a decode step of ~1,100 small kernels pays per kernel (clocks and the
  device's scheduling, not bandwidth or arithmetic);
* ``gemm_tflops``: bf16 TFLOP/s of an 8192 x 8192 x 8192 matrix product (clocks, power);

and reads the SM clock (now and its maximum, MHz), the power limit (W) and the temperature
(degrees C) from NVML where `pynvml` (package nvidia-ml-py) is installed (None otherwise).
Fastest of a few repeats each; higher ``launch_us``, lower ``gemm_tflops`` mean a slower GPU.
"""

from __future__ import annotations

import os
from typing import Any

import torch

CHAIN = 2000  # kernels in the launch probe's graph
GEMM_N = 8192
REPEATS = 5


def _events_ms(fn: Any, repeats: int) -> float:
    """Fastest of `repeats` device times (ms) of `fn`, measured with CUDA events."""
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end))
    return best


def launch_us(device: torch.device) -> float:
    """Microseconds per kernel of `CHAIN` dependent tiny kernels in one CUDA graph."""
    x = torch.zeros(256, device=device)
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        x.add_(1.0)  # warm-up outside the capture
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CHAIN):
            x.add_(1.0)
    graph.replay()
    return 1e3 * _events_ms(graph.replay, REPEATS) / CHAIN


def gemm_tflops(device: torch.device) -> float:
    """bf16 TFLOP/s of a `GEMM_N`-cubed matrix product (fastest of `REPEATS`)."""
    a = torch.randn(GEMM_N, GEMM_N, device=device, dtype=torch.bfloat16)
    b = torch.randn(GEMM_N, GEMM_N, device=device, dtype=torch.bfloat16)
    out = torch.empty_like(a)
    torch.matmul(a, b, out=out)  # cuBLAS heuristics and workspace, outside the timing
    ms = _events_ms(lambda: torch.matmul(a, b, out=out), REPEATS)
    return 2 * GEMM_N**3 / (ms * 1e-3) / 1e12


def nvml_state(index: int) -> dict[str, float | None]:
    """SM clock now and at most (MHz), power limit (W), temperature (C) of CUDA device
    `index`; None where NVML (pynvml) is missing or does not say. NVML numbers the GPUs
    physically, CUDA after ``CUDA_VISIBLE_DEVICES``: the device is found by its UUID."""
    keys = ("sm_clock_mhz", "max_sm_clock_mhz", "power_limit_w", "temperature_c")
    out: dict[str, float | None] = dict.fromkeys(keys)
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
    except Exception:  # no NVML: the probes still run
        return out
    try:
        _read_nvml(pynvml, _nvml_handle(pynvml, index), out)
    except Exception:  # a device NVML does not know: its fields stay None
        pass
    finally:
        pynvml.nvmlShutdown()
    return out


def _nvml_handle(pynvml: Any, index: int) -> Any:
    """NVML's handle of CUDA device `index`: by UUID, else (no ``CUDA_VISIBLE_DEVICES``, where
    both number the GPUs alike) by index.

    Raises:
        Exception: whatever NVML raises when neither finds it.
    """
    try:
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    except Exception:
        if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
            raise
        return pynvml.nvmlDeviceGetHandleByIndex(index)


def _read_nvml(pynvml: Any, h: Any, out: dict[str, float | None]) -> None:
    """Fill `out`'s NVML fields from handle `h` (each None where the driver does not say)."""
    reads = {
        "sm_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
        "max_sm_clock_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
        "power_limit_w": lambda: pynvml.nvmlDeviceGetPowerManagementLimit(h) / 1e3,
        "temperature_c": lambda: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
    }
    for key, read in reads.items():
        try:
            out[key] = float(read())
        except Exception:  # a field this driver does not report
            out[key] = None


def device_probe(device: torch.device) -> dict[str, float | str | None]:
    """The probes of the module docstring on `device`, with its name.

    Raises:
        ValueError: `device` is not a CUDA device, or CUDA is not available.
    """
    if device.type != "cuda" or not torch.cuda.is_available():
        raise ValueError(f"the device probe needs a CUDA device, got {device}")
    index = device.index if device.index is not None else torch.cuda.current_device()
    dev = torch.device("cuda", index)
    with torch.inference_mode():
        probe: dict[str, float | str | None] = {
            "device": torch.cuda.get_device_name(dev),
            "launch_us": launch_us(dev),
            "gemm_tflops": gemm_tflops(dev),
        }
    probe.update(nvml_state(index))
    return probe


def describe(probe: dict[str, float | str | None]) -> str:
    """One line: the probe's numbers, `?` where NVML did not say."""

    def num(key: str, fmt: str) -> str:
        value = probe.get(key)
        return "?" if not isinstance(value, int | float) else format(value, fmt)

    return (
        f"device probe: {num('launch_us', '.2f')} us per graph kernel, "
        f"{num('gemm_tflops', '.0f')} bf16 TFLOP/s, SM clock {num('sm_clock_mhz', '.0f')}"
        f"/{num('max_sm_clock_mhz', '.0f')} MHz, power limit {num('power_limit_w', '.0f')} W, "
        f"{num('temperature_c', '.0f')} C"
    )
