"""The load generator's CPU time split over a level, from /proc/stat (busy, stolen)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fishserve.bench.cpu_times import CpuTimes, cpu_shares, parse_cpu_line, read_cpu_times


def test_the_aggregate_line_is_split_into_busy_idle_and_steal() -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice
    times = parse_cpu_line("cpu  100 5 20 700 10 1 4 60 30 0")
    assert times == CpuTimes(busy=100 + 5 + 20 + 1 + 4, idle=700 + 10, steal=60)
    assert times.total == 900  # guest time is inside user already: not added again
    old_kernel = parse_cpu_line("cpu 10 0 5 85")  # the 4 fields every kernel has
    assert old_kernel == CpuTimes(busy=15, idle=85, steal=0)


@pytest.mark.parametrize("line", ["cpu0 1 2 3 4 5 6 7 8", "cpu 1 2", "intr 5 6 7 8", ""])
def test_other_lines_are_refused(line: str) -> None:
    with pytest.raises(ValueError):
        parse_cpu_line(line)


def test_shares_between_two_readings() -> None:
    before = CpuTimes(busy=1000, idle=4000, steal=0)
    after = CpuTimes(busy=1500, idle=4300, steal=200)  # 1,000 ticks: 50% busy, 20% stolen
    assert cpu_shares(before, after) == pytest.approx((0.5, 0.2))
    assert cpu_shares(before, before) is None  # no time between them
    assert cpu_shares(None, after) is None and cpu_shares(before, None) is None


def test_reading_a_stat_file_and_a_missing_one(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  10 0 5 80 5 0 0 3 0 0\ncpu0 10 0 5 80 5 0 0 3 0 0\nintr 1\n")
    assert read_cpu_times(stat) == CpuTimes(busy=15, idle=85, steal=3)
    assert read_cpu_times(tmp_path / "none") is None
    (tmp_path / "bad").write_text("cpu  x y z w\n")
    assert read_cpu_times(tmp_path / "bad") is None


def test_this_machine_reads_its_own_cpu_times_where_it_has_proc() -> None:
    if not Path("/proc/stat").exists():
        pytest.skip("no /proc/stat (not Linux)")
    first = read_cpu_times()
    assert first is not None and first.total > 0
