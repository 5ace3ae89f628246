"""Device busy time of a component, measured with CUDA events and never waited for.

`BusyTimer.measure()` wraps a unit of work (an engine step, a decoder call): on CUDA it records
an event pair on the current stream and adds their elapsed time once the end event has
completed, checked without blocking at the next timed unit; so timing adds no host
synchronisation (each one costs the GIL round trip of a blocking wait). On the CPU it adds
wall time.

On CUDA only a random sample of the units is timed, one in `SAMPLE_EVERY` on average, each
counted `SAMPLE_EVERY` times (an unbiased estimate of the total): the creation, record, query
and elapsed-time calls of an event pair are each a PyTorch call that releases and re-acquires
the GIL, which in the engine's process costs ~0.5 ms per call under load
(docs/benchmarks.md §6.15: 2.5% of the engine thread's and 5% of the decoder thread's time
went to event records). A random sample rather than every n-th unit: a component that
alternates two kinds of unit (a step's launch and its finish) would otherwise time only one
kind. `seconds` lags by the units since the last timed one.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

# On CUDA, one unit in this many (on average) is timed; see the module docstring.
SAMPLE_EVERY = 8


class BusyTimer:
    """Accumulated busy seconds of one component on `device` (see module docstring).

    Args:
        device: where the work runs (CUDA: events; otherwise wall time).
        sample_every: time one unit in this many on average, each counted this many times
            (default `SAMPLE_EVERY` on CUDA, 1 elsewhere: every unit).
        seed: seed of the sampling's random generator (reproducible estimates in tests).

    Raises:
        ValueError: `sample_every` < 1.
    """

    def __init__(
        self, device: torch.device, sample_every: int | None = None, seed: int = 0
    ) -> None:
        self.cuda = device.type == "cuda"
        if sample_every is None:
            sample_every = SAMPLE_EVERY if self.cuda else 1
        if sample_every < 1:
            raise ValueError(f"sample_every must be at least 1, got {sample_every}")
        self.sample_every = sample_every
        self._rng = random.Random(seed)
        self._total = 0.0
        self._pending: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    @property
    def seconds(self) -> float:
        """Busy seconds of the completed units of work (an estimate when sampling)."""
        return self._total

    @contextmanager
    def measure(self) -> Iterator[None]:
        """Time the body (on CUDA: the work it enqueues on the current stream), if sampled."""
        if self.sample_every > 1 and self._rng.random() * self.sample_every >= 1.0:
            yield  # not in the sample
            return
        if not self.cuda:
            start = time.perf_counter()
            try:
                yield
            finally:
                self._total += (time.perf_counter() - start) * self.sample_every
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
            self._total += begin.elapsed_time(end) / 1e3 * self.sample_every
            done += 1
        del self._pending[:done]
