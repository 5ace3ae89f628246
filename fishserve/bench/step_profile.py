"""Where an engine step's time goes: `torch.profiler` over a few steps (`bench-engine
--profile-steps`).

The profiler records every kernel and copy on the device; per step it gives how many there
are, their summed device time and the device span (first start to last end). A kernel time
far below the span means the GPU waits between kernels: for the host (inputs, scheduling, a
mid-step synchronisation) or for launches. Profiling slows the host, so `wall_ms` is not the
step time `bench-engine` reports; the device-side numbers are the ones to read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.profiler import profile

from fishserve.engine.step_profiler import operator_table, profiler_activities

__all__ = ["StepProfile", "profile_steps"]


@dataclass
class StepProfile:
    """Per-step averages of the profiled steps.

    Attributes:
        wall_ms: host milliseconds per step while profiling (inflated by the profiler).
        kernels: device kernels and copies per step (0 on the CPU).
        kernel_ms: their summed device milliseconds per step.
        span_ms: device milliseconds per step from the first kernel's start to the last one's
            end (`span_ms - kernel_ms`: the GPU idle inside the steps).
        table: the operator table (`torch.profiler` key averages), as text.
    """

    wall_ms: float
    kernels: float
    kernel_ms: float
    span_ms: float
    table: str


def profile_steps(step: Callable[[], object], steps: int) -> StepProfile:
    """Run `step` `steps` times (>= 1) under `torch.profiler`; per-step averages.

    Raises:
        ValueError: steps < 1.
    """
    if steps < 1:
        raise ValueError(f"profile at least one step, got {steps}")
    with profile(activities=profiler_activities()) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        wall_s = time.perf_counter() - start
    device = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    span_us = 0.0
    if device:
        span_us = max(e.time_range.end for e in device) - min(e.time_range.start for e in device)
    return StepProfile(
        wall_ms=wall_s / steps * 1e3,
        kernels=len(device) / steps,
        kernel_ms=sum(e.device_time_total for e in device) / steps / 1e3,
        span_ms=span_us / steps / 1e3,
        table=operator_table(prof, self_time=True),
    )
