"""The load generator's CPU time split over a level (psutil): busy, stolen."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from fishserve.bench.cpu_times import CpuTimes, cpu_shares, read_cpu_times


def test_the_cpu_times_are_split_into_busy_idle_and_steal(monkeypatch) -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice, as on Linux
    linux = SimpleNamespace(
        user=100, nice=5, system=20, idle=700, iowait=10, irq=1, softirq=4, steal=60, guest=30
    )
    monkeypatch.setitem(sys.modules, "psutil", SimpleNamespace(cpu_times=lambda: linux))
    times = read_cpu_times()
    assert times == CpuTimes(busy=100 + 5 + 20 + 1 + 4, idle=700 + 10, steal=60)
    assert times.total == 900  # guest time is inside user already: not added again
    other_os = SimpleNamespace(user=10, nice=0, system=5, idle=85)  # no steal, iowait, irq
    monkeypatch.setitem(sys.modules, "psutil", SimpleNamespace(cpu_times=lambda: other_os))
    assert read_cpu_times() == CpuTimes(busy=15, idle=85, steal=0)


def test_without_psutil_there_is_no_reading(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil raises ImportError
    assert read_cpu_times() is None


def test_shares_between_two_readings() -> None:
    before = CpuTimes(busy=1000, idle=4000, steal=0)
    after = CpuTimes(busy=1500, idle=4300, steal=200)  # 1,000 s: 50% busy, 20% stolen
    assert cpu_shares(before, after) == pytest.approx((0.5, 0.2))
    assert cpu_shares(before, before) is None  # no time between them
    assert cpu_shares(None, after) is None and cpu_shares(before, None) is None


def test_this_machine_reads_its_own_cpu_times() -> None:
    first = read_cpu_times()
    assert first is not None and first.total > 0
