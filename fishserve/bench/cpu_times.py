"""The machine's CPU time over a level, from Linux's ``/proc/stat``: busy and stolen shares.

On a virtual machine the hypervisor can give a guest's CPUs to other guests; the guest sees
that time as *steal*. The server's host work (Python, one GIL per process) sets its capacity
(docs/benchmarks.md §6.25-§6.27), and on one H200 lease the same code passed 832 streams and
later collapsed at 832 while the host probe went from 5 to 12 ms: a level's steal share says
whether the machine's CPUs were taken away during it. Source of the fields: proc(5), the
``cpu`` line (user nice system idle iowait irq softirq steal guest guest_nice, in clock
ticks; guest time is already counted in user).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")

__all__ = ["CpuTimes", "cpu_shares", "parse_cpu_line", "read_cpu_times"]


@dataclass(frozen=True)
class CpuTimes:
    """Cumulative clock ticks of all CPUs since boot.

    Attributes:
        busy: user + nice + system + irq + softirq; idle: idle + iowait; steal: time the
            hypervisor ran something else on this guest's CPUs.
    """

    busy: int
    idle: int
    steal: int

    @property
    def total(self) -> int:
        """All ticks counted."""
        return self.busy + self.idle + self.steal


def parse_cpu_line(line: str) -> CpuTimes:
    """`CpuTimes` of an aggregate ``cpu`` line of ``/proc/stat``.

    Raises:
        ValueError: not a ``cpu`` line with at least the 4 fields every kernel has.
    """
    name, *fields = line.split()
    if name != "cpu" or len(fields) < 4:
        raise ValueError(f"not the aggregate cpu line of /proc/stat: {line!r}")
    ticks = [int(x) for x in fields[:8]] + [0] * (8 - min(len(fields), 8))
    user, nice, system, idle, iowait, irq, softirq, steal = ticks
    return CpuTimes(user + nice + system + irq + softirq, idle + iowait, steal)


def read_cpu_times(path: Path = PROC_STAT) -> CpuTimes | None:
    """This machine's `CpuTimes` now, or None where ``/proc/stat`` cannot be read (not
    Linux) or has no aggregate line."""
    try:
        with path.open(encoding="ascii") as stat:
            for line in stat:
                if line.startswith("cpu "):
                    return parse_cpu_line(line)
    except (OSError, ValueError):
        return None
    return None


def cpu_shares(before: CpuTimes | None, after: CpuTimes | None) -> tuple[float, float] | None:
    """(busy, steal) shares of all CPUs' time between two readings, each in [0, 1]; None
    without both readings or without ticks between them."""
    if before is None or after is None:
        return None
    total = after.total - before.total
    if total <= 0:
        return None
    busy, steal = after.busy - before.busy, after.steal - before.steal
    return max(0.0, busy / total), max(0.0, steal / total)
