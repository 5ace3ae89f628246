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
    timer = BusyTimer(torch.device("cuda"))
    x = torch.randn(4096, 4096, device="cuda")
    with timer.measure():
        for _ in range(20):
            x = x @ x / 64
    assert timer.seconds == 0.0  # nothing waited for yet
    torch.cuda.synchronize()
    with timer.measure():
        pass
    assert timer.seconds > 0
