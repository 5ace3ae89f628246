"""How long the engine's process makes a thread wait for Python's GIL.

The engine, decoder and event-loop threads of the engine's process share one GIL, and every
PyTorch call releases it and must win it back: at 384 streams on an H200 that took 0.48 ms on
average (docs/benchmarks.md §6.15), several times per engine step and decoder call. `GilProbe`
measures it continuously: a daemon thread sleeps `period_s` seconds in a loop and adds up how
late it wakes up (the OS timer's own slack is part of it: ~0.07 ms in an idle process on the
H200's host). The totals feed `fishserve:gil_wait_seconds_total` and
`fishserve:gil_probe_wakeups_total`; their ratio is the mean wait of a thread that wants the
GIL back. The probe holds the GIL a few microseconds per wake-up.
"""

from __future__ import annotations

import threading
import time

DEFAULT_PERIOD_S = 0.005


class GilProbe:
    """A daemon thread measuring the GIL wait of this process (see module docstring).

    Args:
        period_s: seconds slept between wake-ups (> 0).

    Raises:
        ValueError: a period that is not a positive number of seconds.
    """

    def __init__(self, period_s: float = DEFAULT_PERIOD_S) -> None:
        if not period_s > 0:
            raise ValueError(f"the GIL probe's period must be > 0 s, got {period_s}")
        self.period_s = period_s
        self._wait = 0.0
        self._wakeups = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fishserve-gil-probe", daemon=True)

    def start(self) -> None:
        """Start measuring."""
        self._thread.start()

    def stop(self) -> None:
        """Stop measuring (the totals stay)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=1.0)

    def totals(self) -> tuple[float, int]:
        """``(seconds waited in all, wake-ups)`` so far."""
        return self._wait, self._wakeups

    def _run(self) -> None:
        period = self.period_s
        while True:
            start = time.perf_counter()
            if self._stop.wait(period):
                return
            late = time.perf_counter() - start - period
            self._wait += max(0.0, late)
            self._wakeups += 1
