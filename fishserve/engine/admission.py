"""Real-time admission: hold new requests while running streams get too few frames per second.

A streaming TTS engine is overloaded long before its KV pool is full: every running stream
must get at least the audio's frame rate (21.53 frames/s for the release, 44,100 Hz / 2,048
samples per frame) or its client runs out of audio. Each step computes one frame per running
sequence, so adding streams slows every stream's rate; past the engine's capacity every stream
falls behind, and a streaming server then sends shorter chunks, which costs the decoder and
the host more per frame and lowers the capacity further (docs/benchmarks.md §6.29-§6.30).

`StreamRateGate` measures the frames per second the engine generated over the last
`window_s` seconds and admits a request that has not run yet only while the running sequences
are fewer than that rate serves at `min_rate` frames per second each. Held requests wait in
the queue (first come, first served; the server's queue bound and timeout still apply), so
overload shows as time to first audio, and as "busy" once the queue is full, instead of as
gaps in every stream. Sequences that already ran
(preempted, or between text segments) are never held.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from math import ceil

# Seconds of steps the rate is measured over: ~20-30 steps of a loaded H200 (40-60 steps/s
# at 1,000 streams, §6.30-§6.31): long enough to average boost and full steps, short enough
# that an engine with room admits a ramp of new streams within a second or two.
RATE_WINDOW_S = 0.5


class StreamRateGate:
    """Admission by the frame rate each running sequence would get.

    Args:
        min_rate: frames per second per running sequence: requests that have not run yet are
            held while the engine's recent frame rate does not serve one more sequence at
            this rate (e.g. 1.1 x the audio's frame rate for 10% headroom); > 0.
        window_s: seconds of recent steps the rate is measured over (`RATE_WINDOW_S`).
        clock: monotonic seconds (tests pass a fake one).

    Raises:
        ValueError: `min_rate` or `window_s` not positive.
    """

    def __init__(
        self,
        min_rate: float,
        window_s: float = RATE_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not min_rate > 0 or not window_s > 0:
            raise ValueError(f"min_rate and window_s must be > 0, got {min_rate}, {window_s}")
        self.min_rate, self.window_s, self._clock = min_rate, window_s, clock
        # (time s, frames generated so far, running sequences) at each step's scheduling
        self._samples: deque[tuple[float, int, int]] = deque()
        self._running_sum = 0  # of the samples' running counts
        self.held = 0  # steps that held a request (a counter for metrics)
        self._held_this_step = False
        # running sequences the gate allows this step (new ones join while fewer run); read
        # by other threads for the queue bound (`AsyncEngine`): one attribute, set at once
        self.capacity = 1

    def reset(self) -> None:
        """Forget the steps so far and the `held` count (after the engine's warm-up)."""
        self._samples.clear()
        self._running_sum, self.held, self.capacity = 0, 0, 1

    def record(self, frames_generated: int, running: int) -> None:
        """Note the engine's frame count (total so far) and running sequences and set
        `capacity`; call once per step, before it is scheduled.

        An empty engine's past rate says nothing about its next streams: with none running
        the steps so far are forgotten. One step before the window is kept as the baseline,
        so that steps longer than the window are still measured.
        """
        now = self._clock()
        samples = self._samples
        if running == 0:
            samples.clear()
            self._running_sum = 0
        samples.append((now, frames_generated, running))
        self._running_sum += running
        while len(samples) > 2 and samples[1][0] <= now - self.window_s:
            self._running_sum -= samples.popleft()[2]
        self._held_this_step = False
        total = self._measured_rate()
        # admits while running < total / min_rate, i.e. running + 1 <= ceil(total / min_rate)
        self.capacity = max(1, running) if total is None else max(1, ceil(total / self.min_rate))

    def _measured_rate(self) -> float | None:
        """Frames per second over the samples (None with fewer than two)."""
        samples = self._samples
        if len(samples) < 2:
            return None
        (t0, f0, _), (t1, f1, _) = samples[0], samples[-1]
        return max(0, f1 - f0) / (t1 - t0) if t1 > t0 else None

    def frame_rate(self) -> float | None:
        """Frames per second the engine generated over the window (all sequences); None with
        fewer than two steps measured or no step for a window's time (idle)."""
        if not self._samples or self._clock() - self._samples[-1][0] > self.window_s:
            return None  # an engine that stopped stepping: its old rate says nothing
        return self._measured_rate()

    def stream_rate(self) -> float | None:
        """Frames per second per running sequence over the window; None as `frame_rate`, or
        with none running."""
        total = self.frame_rate()
        if not total:  # None, or no frames: no rate per stream either
            return None
        # the frames between the first and last sample were made by the sequences running at
        # the samples before the last one (a rate means two samples at least)
        samples = self._samples
        running = (self._running_sum - samples[-1][2]) / (len(samples) - 1)
        return total / running if running > 0 else None

    def admits(self, running: int) -> bool:
        """Whether a request that has not run yet may join `running` sequences now: while
        `running` < `capacity` (set by `record`: the engine's recent frame rate / `min_rate`,
        and 1 until a rate is measured), so always with none running. A loaded engine's frame
        rate changes little with one stream more, so admissions stop near that count instead
        of in bursts; an engine with room makes more frames per second with each stream it
        admits, so its count grows step by step. A burst after an idle spell starts with one
        request, the rest a step or two later, once the rate is measured. Counts a step that
        refused in `held` (once per step)."""
        if running < self.capacity:
            return True
        if not self._held_this_step:
            self.held += 1
            self._held_this_step = True
        return False
