"""Python's garbage collector in a serving process: frozen after start-up, long pauses logged.

A full (generation 2) collection walks every tracked container object in the process. After
start-up that means the model's modules and, on a GPU, the compilers' caches (torch.compile,
Triton, CUDA-graph bookkeeping): a pause of a large fraction of a second, during which the
engine thread cannot start a step and every stream's next frame is late. On the H200, with the
engine core serving 128-384 streams, time to first audio showed one such hiccup every few
seconds (docs/benchmarks.md §6.5). `gc.freeze()` after loading moves everything that exists
then into a permanent generation that collections skip (the remedy the Python documentation
gives for this, and what vLLM does after start-up); objects made while serving are still
collected as usual. `GcPauseLog` reports the collections that still take long.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

log = logging.getLogger(__name__)

SLOW_PAUSE_S = 0.05  # a collection longer than this (seconds) is logged as a warning

__all__ = ["GC_PAUSES", "GcPauseLog", "freeze_after_startup"]


def freeze_after_startup() -> int:
    """Unfreeze, collect once, then freeze every surviving object (`gc.freeze`); returns how
    many are frozen.

    Call when loading is done and before serving: later collections then skip the model's
    and the compilers' objects. Unfreezing first makes a reload (lazy loading, a model unloaded
    when idle, a restarted engine process) collect what an earlier load froze and has since
    died, such as the previous model's cycles, instead of keeping it forever.
    """
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("garbage collector: %d start-up objects frozen (skipped by collections)", frozen)
    return frozen


class GcPauseLog:
    """Times every collection through `gc.callbacks`; logs those over `slow_s` seconds.

    Attributes:
        pauses: collections timed; slow: how many took longer than `slow_s`;
        max_pause_s: the longest, in seconds.
    """

    def __init__(self, slow_s: float = SLOW_PAUSE_S) -> None:
        self.slow_s = slow_s
        self.pauses = 0
        self.slow = 0
        self.max_pause_s = 0.0
        self._start = 0.0

    def install(self) -> GcPauseLog:
        """Start timing (idempotent); returns self."""
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)
        return self

    def uninstall(self) -> None:
        """Stop timing."""
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            return
        pause = time.perf_counter() - self._start
        self.pauses += 1
        self.max_pause_s = max(self.max_pause_s, pause)
        if pause > self.slow_s:
            self.slow += 1
            log.warning(
                "garbage collection of generation %s took %.0f ms (%s objects collected)",
                info.get("generation"),
                1e3 * pause,
                info.get("collected"),
            )


GC_PAUSES = GcPauseLog()  # the process's log (installed by the server at start-up)
