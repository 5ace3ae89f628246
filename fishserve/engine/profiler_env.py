"""The step profiler's environment variables (`StepProfiler.from_env`), without PyTorch: the
server's settings name them as known variables before anything heavy is imported."""

from __future__ import annotations

ENV_DIR = "FISHSERVE_TORCH_PROFILER_DIR"
ENV_START = "FISHSERVE_PROFILE_START_STEP"
ENV_STEPS = "FISHSERVE_PROFILE_STEPS"
ENV_VARS = frozenset({ENV_DIR, ENV_START, ENV_STEPS})
