"""The machine's CPU time over a level (psutil): busy and stolen shares.

On a virtual machine the hypervisor can give a guest's CPUs to other guests; the guest sees
that time as *steal*. The server's host work (Python, one GIL per process) sets its capacity
(docs/benchmarks.md §6.25-§6.27), and on one H200 lease the same code passed 832 streams and
later collapsed at 832 while the host probe went from 5 to 12 ms: a level's steal share says
whether the machine's CPUs were taken away during it. The times are `psutil.cpu_times()` (all
CPUs, seconds; on Linux the fields of proc(5)'s ``cpu`` line, where guest time is already
counted in user; no steal field elsewhere).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CpuTimes", "cpu_shares", "read_cpu_times"]


@dataclass(frozen=True)
class CpuTimes:
    """Cumulative CPU seconds of all CPUs since boot.

    Attributes:
        busy: user + nice + system + irq + softirq; idle: idle + iowait; steal: time the
            hypervisor ran something else on this guest's CPUs (0 where not reported).
    """

    busy: float
    idle: float
    steal: float

    @property
    def total(self) -> float:
        """All time counted (seconds)."""
        return self.busy + self.idle + self.steal


def read_cpu_times() -> CpuTimes | None:
    """This machine's `CpuTimes` now, or None without psutil (an optional import: a machine
    that runs the load generator without it, such as a bare GPU image, still runs it)."""
    try:
        import psutil
    except ImportError:
        return None
    times = psutil.cpu_times()

    def seconds(*fields: str) -> float:  # the fields vary by OS
        return sum(float(getattr(times, field, 0.0)) for field in fields)

    busy = seconds("user", "nice", "system", "irq", "softirq")
    return CpuTimes(busy, seconds("idle", "iowait"), seconds("steal"))


def cpu_shares(before: CpuTimes | None, after: CpuTimes | None) -> tuple[float, float] | None:
    """(busy, steal) shares of all CPUs' time between two readings, each in [0, 1]; None
    without both readings or without time between them."""
    if before is None or after is None:
        return None
    total = after.total - before.total
    if total <= 0:
        return None
    busy, steal = after.busy - before.busy, after.steal - before.steal
    return max(0.0, busy / total), max(0.0, steal / total)
