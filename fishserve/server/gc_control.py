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

Full collections while serving (`DeferredFullCollections`). Freezing is not enough at ~700
streams: on the H200 the engine's process still ran a generation-2 collection every ~5 s,
each 52-70 ms (the HTTP process's 125-141 ms), and none of them found garbage (docs/benchmarks.md
§6.27). CPython starts one after every `threshold2` (10) generation-1 collections once the
objects that survived into the oldest generation have grown by a quarter; after a freeze that
generation starts nearly empty, so every few thousand surviving per-stream objects start one,
and each holds the GIL: every stream's next frame and audio wait. So the server raises
`threshold2` out of reach and runs full collections itself: when the process is idle (at most
every `MIN_IDLE_GAP_S`), and in any case every `max_interval_s`, so that cyclic garbage that
outlived the younger generations is still freed. Younger generations are collected as usual
(they are small and fast). Where CPython ignores `threshold2` (the incremental collector of
3.14, free-threaded builds), its full collections are not held off; the idle and interval
collections then only add to them.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)

SLOW_PAUSE_S = 0.05  # a collection longer than this (seconds) is logged as a warning

# A generation-2 threshold CPython never reaches: it counts generation-1 collections (about
# one per second under load), so automatic full collections stop.
NO_AUTO_FULL = 2**31 - 1  # (a C int)
MIN_IDLE_GAP_S = 30.0  # an idle process runs a full collection at most this often (seconds)
MIN_FULL_INTERVAL_S = 10.0  # the shortest `max_interval_s` the server accepts (seconds)
CPYTHON_THRESHOLD2 = 10  # CPython's default generation-2 threshold
POLL_S = 1.0  # how often the collector thread checks whether one is due (seconds)

__all__ = [
    "FULL_COLLECTIONS",
    "GC_PAUSES",
    "MIN_FULL_INTERVAL_S",
    "DeferredFullCollections",
    "GcPauseLog",
    "freeze_after_startup",
    "no_automatic_full_collections",
]


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


@contextlib.contextmanager
def no_automatic_full_collections() -> Iterator[None]:
    """Within the block CPython starts no generation-2 collection by itself (younger ones run as
    usual); the thresholds are restored on exit, except the generation-2 one while the
    process's `FULL_COLLECTIONS` holds full collections off (it restores that one itself)."""
    saved = gc.get_threshold()
    gc.set_threshold(saved[0], saved[1], NO_AUTO_FULL)
    try:
        yield
    finally:
        third = NO_AUTO_FULL if FULL_COLLECTIONS.active else saved[2]
        gc.set_threshold(saved[0], saved[1], third)


class DeferredFullCollections:
    """Generation-2 collections when the process is idle, or every `max_interval_s` (module
    docstring); one per process (`FULL_COLLECTIONS`).

    Args:
        poll_s: seconds between the collector thread's checks.
        min_idle_gap_s: seconds between two collections of an idle process at least.

    Attributes:
        collections: full collections run by this object; last: ``time.monotonic()`` of the
        last one (or of `start`).
    """

    def __init__(self, poll_s: float = POLL_S, min_idle_gap_s: float = MIN_IDLE_GAP_S) -> None:
        self.poll_s, self.min_idle_gap_s = poll_s, min_idle_gap_s
        self.max_interval_s = 0.0
        self.collections = 0
        self.last = time.monotonic()
        self._idle: Callable[[], Callable[[], bool] | None] = _ALWAYS_IDLE
        self._lock = threading.Lock()
        self._saved: tuple[int, ...] | None = None  # thresholds before `start`
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def active(self) -> bool:
        """Whether automatic full collections are held off by this object."""
        return self._saved is not None

    def start(self, idle: Callable[[], bool], max_interval_s: float) -> None:
        """Hold off CPython's own full collections and run them from a daemon thread: when
        `idle()` (True when the process serves nothing; an exception counts as busy) and at
        least `min_idle_gap_s` after the last, or `max_interval_s` after the last in any case.
        Called again, it takes the new `idle` and interval. `max_interval_s` <= 0: CPython's
        own collections (`stop`). A bound method is held weakly (this process-wide object
        must not keep a stopped runtime and its models alive); once its object is gone, the
        process counts as idle.
        """
        if max_interval_s <= 0:
            self.stop()
            return
        with self._lock:
            self._idle, self.max_interval_s = _weak(idle), max_interval_s
            if self._saved is None:
                t0, t1, t2 = gc.get_threshold()
                self._saved = (t0, t1, CPYTHON_THRESHOLD2 if t2 == NO_AUTO_FULL else t2)
                gc.set_threshold(t0, t1, NO_AUTO_FULL)
                self.last = time.monotonic()
            if self._thread is None or not self._thread.is_alive():
                self._stop = threading.Event()
                self._thread = threading.Thread(
                    target=self._loop, args=(self._stop,), name="fishserve-gc", daemon=True
                )
                self._thread.start()

    def stop(self) -> None:
        """Give full collections back to CPython (thresholds as before `start`)."""
        with self._lock:
            self._stop.set()
            self._idle = _ALWAYS_IDLE  # nothing of the stopped server stays referenced
            if self._saved is not None:
                gc.set_threshold(*self._saved)
                self._saved = None
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.poll_s + 1)

    def due(self, now: float) -> bool:
        """Whether a full collection should run at monotonic time `now`: the interval has
        passed, or the process is idle, the idle gap has passed and generation-1 collections
        ran since the last one (something may have reached the oldest generation)."""
        since = now - self.last
        if since >= self.max_interval_s:
            return True
        if since < self.min_idle_gap_s or gc.get_count()[2] == 0:
            return False
        try:
            check = self._idle()
            return True if check is None else bool(check())
        except Exception:  # a half-built or stopped runtime: not idle
            return False

    def collect(self) -> int:
        """Run a full collection now; returns how many objects it found unreachable."""
        found = gc.collect(2)
        self.collections += 1
        self.last = time.monotonic()
        return found

    def _loop(self, stop: threading.Event) -> None:
        while not stop.wait(self.poll_s):
            if self.due(time.monotonic()):
                self.collect()


def _always_idle() -> bool:
    return True


def _weak(idle: Callable[[], bool]) -> Callable[[], Callable[[], bool] | None]:
    """A reference to `idle` that does not keep a bound method's object alive."""
    if hasattr(idle, "__self__") and hasattr(idle, "__func__"):
        return weakref.WeakMethod(idle)  # type: ignore[arg-type]
    return lambda: idle


_ALWAYS_IDLE = _weak(_always_idle)
FULL_COLLECTIONS = DeferredFullCollections()  # the process's (started by the server)
