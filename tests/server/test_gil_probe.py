"""The GIL probe: how long a thread of the process waits to get the GIL back."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from fishserve.server.gil_probe import GilProbe


def test_a_busy_python_thread_makes_the_probe_wait() -> None:
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)  # CPython's default: a waiter gets the GIL after ~5 ms
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(200))  # pure Python: holds the GIL until asked to drop it

    probe = GilProbe(period_s=0.002)
    probe.start()
    time.sleep(0.3)
    idle_wait, idle_wakeups = probe.totals()
    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    time.sleep(0.6)
    wait, wakeups = probe.totals()
    stop.set()
    spinner.join()
    probe.stop()
    sys.setswitchinterval(before)
    assert idle_wakeups > 0 and wakeups > idle_wakeups
    busy_mean = (wait - idle_wait) / (wakeups - idle_wakeups)
    assert busy_mean > 0.001  # each wake-up waited for the spinning thread's switch interval
    stopped = probe.totals()
    time.sleep(0.05)
    assert probe.totals() == stopped  # no more wake-ups once stopped


def test_the_probe_refuses_a_period_that_is_not_positive() -> None:
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="period"):
            GilProbe(bad)
