"""Device busy time of a component, measured with CUDA events and never waited for.

`BusyTimer.measure()` wraps a unit of work (an engine step, a decoder call): on CUDA it records
an event pair on the current stream and adds their elapsed time once the end event has
completed, checked without blocking at the next `measure()`; so timing adds no host
synchronisation (each one costs the GIL round trip of a blocking wait). On the CPU it adds
wall time. `seconds` lags by at most the last unit of work.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class BusyTimer:
    """Accumulated busy seconds of one component on `device` (see module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._total = 0.0
        self._pending: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    @property
    def seconds(self) -> float:
        """Busy seconds of the completed units of work."""
        return self._total

    @contextmanager
    def measure(self) -> Iterator[None]:
        """Time the body (on CUDA: the work it enqueues on the current stream)."""
        if not self.cuda:
            start = time.perf_counter()
            try:
                yield
            finally:
                self._total += time.perf_counter() - start
            return
        self._harvest()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        try:
            yield
        finally:
            end.record()
            self._pending.append((begin, end))

    def restore(self, seconds: float) -> None:
        """Set the total back to `seconds` and forget the pending work (start-up warm-up)."""
        self._pending.clear()
        self._total = seconds

    def _harvest(self) -> None:
        """Add the pairs whose end event has completed (no waiting)."""
        done = 0
        for begin, end in self._pending:
            if not end.query():
                break
            self._total += begin.elapsed_time(end) / 1e3
            done += 1
        del self._pending[:done]
