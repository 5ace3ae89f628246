"""The host probe recorded with benchmark runs."""

from __future__ import annotations

import pytest

from fishserve.host_probe import host_probe_ms


def test_probe_grows_with_the_work() -> None:
    one, many = host_probe_ms(rounds=2, repeats=3), host_probe_ms(rounds=40, repeats=3)
    assert 0 < one < many


@pytest.mark.parametrize(("rounds", "repeats"), [(0, 1), (1, 0)])
def test_probe_refuses_no_work(rounds: int, repeats: int) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        host_probe_ms(rounds, repeats)
