"""Profile a window of engine steps under real load with `torch.profiler` (off by default).

Set ``FISHSERVE_TORCH_PROFILER_DIR=DIR`` (the switch; vLLM's ``VLLM_TORCH_PROFILER_DIR`` plays
the same role) and the engine thread records steps ``FISHSERVE_PROFILE_START_STEP`` (default
500: past start-up and a load generator's ramp) to that plus ``FISHSERVE_PROFILE_STEPS``
(default 30), then writes, once per process:

* ``DIR/engine_steps_<pid>.json``: a Chrome trace (open in Perfetto or ``chrome://tracing``);
* ``DIR/engine_steps_<pid>.txt``: the mean wall time of the recorded steps and the operators
  sorted by device time (host time on CPU).

The profiler records the CPU ops of every thread of the process where PyTorch supports it
(``profile_all_threads``; else the engine thread's only) and the CUDA kernels of every stream,
so the decoder's work (its own thread and stream in the engine core) appears beside the
engine's. Recording slows the recorded steps; the numbers are for finding where time goes, not
for benchmarks. A window still open when the engine stops is written as it is (fewer steps).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from fishserve.engine.profiler_env import ENV_DIR, ENV_START, ENV_STEPS

log = logging.getLogger(__name__)

DEFAULT_START = 500
DEFAULT_STEPS = 30
MAX_STEPS = 1000  # the trace of every step stays in memory until it is written
TABLE_ROWS = 40

__all__ = ["StepProfiler", "operator_table", "profiler_activities"]


def profiler_activities() -> list[ProfilerActivity]:
    """What `torch.profiler` records: host ops, and the device's kernels where there is one."""
    cuda = [ProfilerActivity.CUDA] if torch.cuda.is_available() else []
    return [ProfilerActivity.CPU, *cuda]


def operator_table(prof: profile, self_time: bool = False) -> str:
    """The `TABLE_ROWS` operators of a finished profile that took the most device time (host
    time without a device), total or `self_time` (without the operators they call)."""
    sort = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
    return prof.key_averages().table(
        sort_by=f"self_{sort}" if self_time else sort, row_limit=TABLE_ROWS
    )


def _env_int(name: str, default: int, minimum: int, maximum: int | None = None) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    value = int(raw) if raw.isascii() and raw.isdigit() else -1
    if value < minimum or (maximum is not None and value > maximum):
        upper = f" and <= {maximum}" if maximum is not None else ""
        raise ValueError(f"{name} must be a whole number >= {minimum}{upper}, got {raw!r}")
    return value


def _all_threads_config() -> object | None:
    """Kineto's ``profile_all_threads`` option where this PyTorch has it (None otherwise)."""
    try:
        from torch._C._profiler import _ExperimentalConfig

        return _ExperimentalConfig(profile_all_threads=True)
    except (ImportError, TypeError):
        return None


class StepProfiler:
    """Starts `torch.profiler` before step ``start_step`` and writes it after ``num_steps``.

    Args:
        directory: where the trace and table go; None disables the profiler.
        start_step: engine steps to let pass first (0 = from the first step).
        num_steps: steps to record (at least 1).

    Attributes:
        written: the files written (empty until the window closed).
    """

    def __init__(self, directory: Path | None, start_step: int, num_steps: int) -> None:
        self.directory = directory
        self.start_step = start_step
        self.num_steps = num_steps
        self.written: list[Path] = []
        self._steps = 0
        self._prof: profile | None = None
        self._wall = 0.0
        self._started = 0.0

    @classmethod
    def from_env(cls) -> StepProfiler:
        """The profiler the environment asks for (module docstring); disabled when unset.

        The directory is created here, so an unusable one fails at start.

        Raises:
            ValueError: (with the directory set) a step count that is not a whole number or
                out of range (steps: 1 to `MAX_STEPS`), or a directory that cannot be created.
        """
        raw = os.environ.get(ENV_DIR, "").strip()
        if not raw:
            return cls(None, DEFAULT_START, DEFAULT_STEPS)
        start = _env_int(ENV_START, DEFAULT_START, 0)
        steps = _env_int(ENV_STEPS, DEFAULT_STEPS, 1, MAX_STEPS)
        directory = Path(raw).expanduser()
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"{ENV_DIR}: cannot create {directory}: {exc}") from exc
        if not os.access(directory, os.W_OK):
            raise ValueError(f"{ENV_DIR}: {directory} is not writable")
        return cls(directory, start, steps)

    @property
    def enabled(self) -> bool:
        """Whether a window is still to be recorded."""
        return self.directory is not None and not self.written

    def before_step(self) -> None:
        """Call right before each engine step."""
        if not self.enabled:
            return
        if self._prof is None and self._steps == self.start_step:
            self._prof = profile(
                activities=profiler_activities(), experimental_config=_all_threads_config()
            )
            self._prof.__enter__()
            log.info("profiling engine steps %d to %d", self._steps, self._end - 1)
        self._started = time.perf_counter()

    def after_step(self) -> None:
        """Call right after each engine step; writes the files when the window closes."""
        if not self.enabled:
            return
        if self._prof is not None:
            self._wall += time.perf_counter() - self._started
        self._steps += 1
        if self._prof is not None and self._steps == self._end:
            self._finish()

    def close(self) -> None:
        """Call when the engine stops: writes a window that is still open (fewer steps)."""
        if self._prof is not None:
            self._finish()

    @property
    def _end(self) -> int:
        return self.start_step + self.num_steps

    def _finish(self) -> None:
        assert self.directory is not None and self._prof is not None
        prof, self._prof = self._prof, None
        try:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            prof.__exit__(None, None, None)
            self.directory.mkdir(parents=True, exist_ok=True)
            stem = self.directory / f"engine_steps_{os.getpid()}"
            trace, table = stem.with_suffix(".json"), stem.with_suffix(".txt")
            prof.export_chrome_trace(str(trace))
            recorded = self._steps - self.start_step
            summary = (
                f"engine steps {self.start_step}..{self._steps - 1}: "
                f"{1e3 * self._wall / max(recorded, 1):.2f} ms wall per step (while recording)\n\n"
            )
            table.write_text(summary + operator_table(prof))
            self.written = [trace, table]
            log.info("engine step profile written to %s and %s", trace, table)
        except Exception as exc:  # a failed write must not stop the engine
            log.warning("could not write the engine step profile: %s", exc)
            self.directory = None
