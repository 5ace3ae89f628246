"""BusyTimer: busy seconds of a component, without host synchronisation on CUDA."""

from __future__ import annotations

import time

import pytest
import torch

from fishserve.engine.busy_timer import BusyTimer


def test_cpu_timer_adds_wall_time_of_each_unit() -> None:
    timer = BusyTimer(torch.device("cpu"))
    for _ in range(3):
        with timer.measure():
            time.sleep(0.02)
    assert 0.06 <= timer.seconds < 0.5


def test_cpu_timer_counts_a_failed_unit() -> None:
    timer = BusyTimer(torch.device("cpu"))
    with pytest.raises(ValueError), timer.measure():
        time.sleep(0.01)
        raise ValueError("boom")
    assert timer.seconds >= 0.01


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_timer_harvests_completed_pairs_lazily() -> None:
    timer = BusyTimer(torch.device("cuda"), sample_every=1)
    x = torch.randn(4096, 4096, device="cuda")
    with timer.measure():
        for _ in range(20):
            x = x @ x / 64
    assert timer.seconds == 0.0  # nothing waited for yet
    torch.cuda.synchronize()
    with timer.measure():
        pass
    assert timer.seconds > 0


class _FakeClock:
    """perf_counter that advances only when a unit of work says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_sampled_timer_estimates_the_total_without_bias(monkeypatch) -> None:
    clock = _FakeClock()
    monkeypatch.setattr(time, "perf_counter", clock)
    timer = BusyTimer(torch.device("cpu"), sample_every=8, seed=3)
    durations = [0.001, 0.003] * 4000  # two kinds of unit, alternating (a launch, a finish)
    for d in durations:
        with timer.measure():
            clock.now += d
    assert timer.seconds != pytest.approx(sum(durations), abs=1e-9)  # an estimate, not a sum
    # within 5% (every 8th unit would have timed only one kind: 50% off either way)
    assert timer.seconds == pytest.approx(sum(durations), rel=0.05)


def test_an_unsampled_timer_on_the_cpu_times_every_unit(monkeypatch) -> None:
    clock = _FakeClock()
    monkeypatch.setattr(time, "perf_counter", clock)
    timer = BusyTimer(torch.device("cpu"))
    assert timer.sample_every == 1
    for _ in range(5):
        with timer.measure():
            clock.now += 0.25
    assert timer.seconds == pytest.approx(1.25)


def test_sampling_must_be_at_least_every_unit() -> None:
    with pytest.raises(ValueError, match="sample_every must be at least 1"):
        BusyTimer(torch.device("cpu"), sample_every=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_timer_samples_one_unit_in_eight_by_default() -> None:
    every, sampled = (
        BusyTimer(torch.device("cuda"), sample_every=1),
        BusyTimer(torch.device("cuda")),
    )
    assert sampled.sample_every == 8
    x = torch.randn(1024, 1024, device="cuda")
    for _ in range(800):  # units of equal work, timed by both
        with every.measure(), sampled.measure():
            x = x @ x / 32
    torch.cuda.synchronize()
    every._harvest(), sampled._harvest()  # what the next timed unit would add
    assert every.seconds > 0 and sampled.seconds == pytest.approx(every.seconds, rel=0.3)
