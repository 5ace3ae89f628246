"""Taking turns on one GPU: the engine's steps and the decoder's calls, never at once.

On an H200 an engine step run beside the audio decoder's calls (each on its own CUDA stream)
lasts two to three decoder calls, whatever their size, although the step's stream has the
higher priority: the step is ~1,300 short dependent kernels and each waits for SMs held by the
decoder's long thread blocks (docs/benchmarks.md §6.5). Taking turns gives up that overlap to
run both at their full speed: a step, then one decoder call if one is waiting, then a step.
Which is better is a measurement (issue 8 asks for both); `GpuTurns` is the turn-taking half.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["GpuTurns"]


class GpuTurns:
    """A lock that two or more parties take in turns when more than one wants it.

    A party that held the lock last waits while another party is waiting, so two busy parties
    alternate (engine step, decoder call, engine step, ...); a party alone takes it again at
    once. A party may use it from several threads (the decoder thread and reference encoding
    both take the decoder's turns); they hold its turns one at a time.

    Attributes:
        waited_seconds: wall seconds each party spent waiting for a turn (for metrics).
    """

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._owner: str | None = None
        self._last: str | None = None
        self._waiting: collections.Counter[str] = collections.Counter()
        self.waited_seconds: collections.Counter[str] = collections.Counter()

    @contextmanager
    def turn(self, party: str) -> Iterator[None]:
        """Hold the GPU for `party` inside the block (see the class docstring)."""
        self._acquire(party)
        try:
            yield
        finally:
            self._release(party)

    def _must_wait(self, party: str) -> bool:
        if self._owner is not None:
            return True
        others = any(n for name, n in self._waiting.items() if name != party)
        return others and self._last == party

    def _acquire(self, party: str) -> None:
        start = time.perf_counter()
        with self._cv:
            self._waiting[party] += 1
            while self._must_wait(party):
                self._cv.wait()
            self._waiting[party] -= 1
            self._owner = party
            self.waited_seconds[party] += time.perf_counter() - start

    def _release(self, party: str) -> None:
        with self._cv:
            if self._owner != party:
                raise RuntimeError(f"{party} released a turn held by {self._owner}")
            self._owner = None
            self._last = party
            self._cv.notify_all()
