"""Per-level summary of a benchmark: percentiles, throughput, errors, real-time streams.

Percentiles use linear interpolation between order statistics (numpy's default). Latency and
TTFA percentiles cover successful requests only; failures are counted by status. Throughput
divides by the level's wall time (first send to last byte).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fishserve.bench.client import RequestRecord

PERCENTILES = (50, 90, 99)


def percentiles(values: list[float]) -> dict[str, float | None]:
    """{"p50": ..., "p90": ..., "p99": ...}; None for each when `values` is empty."""
    if not values:
        return {f"p{q}": None for q in PERCENTILES}
    arr = np.asarray(values, dtype=np.float64)
    return {f"p{q}": float(np.percentile(arr, q)) for q in PERCENTILES}


@dataclass
class LevelSummary:
    """What one level measured.

    Attributes:
        level: concurrency, or arrival rate (requests/s) in Poisson mode.
        requests, ok: requests finished, and those with HTTP 200 and audio.
        errors: failed requests by status ("429", "503", "timeout", ...).
        duration_s: wall seconds from the level's first send to its last byte.
        latency_s, ttfa_s, rtf: percentiles over successful requests.
        sent_s: percentiles of the client's own time to send a request (a pooled or new
            connection and the upload; `RequestRecord.sent_s`) over successful requests: a
            high value here is the load generator's or the network's part of TTFA.
        ttfa_early_s, ttfa_late_s: TTFA percentiles of the successful requests sent in the
            first and in the second half of the level's sending window (`halves`): TTFA still
            rising from one to the other means the level ended before the server reached
            steady state (`still_rising`). ttfa_halves_n: how many TTFAs each half has.
        rtf_max: the worst real-time factor.
        requests_per_min: successful requests per minute of wall time.
        audio_s_per_s: seconds of audio delivered per wall second (all streams together).
        frames_per_s: audio frames delivered per wall second (all streams together).
        stream_frames_per_s: median per-stream frames per second.
        all_realtime: every successful request had RTF <= 1 (None without successes).
        stalled_streams: successful streams that fell behind playback at some point.
        peak_gpu_bytes: largest GPU memory use seen during the level, or None.
        mean_in_flight: requests in flight on average over the level (sum of latencies over
            the level's duration, Little's law): the load the level really put on the server.
        decoder_frames_per_s, llm_busy, decoder_busy, steps_per_s, frames_per_step,
            full_sort_share, decoder_frames_per_call, decoder_frames_per_job, gil_wait_ms,
            boost_share, server_ttfa_s, queue_s, first_chunk_decode_s, first_chunk_frames:
            the server's own counters over the level
            (`fishserve.bench.server_counters.ServerRates`), None for other servers.
        host_probe_ms, host_probe_after_ms: the load generator's machine's host probe
            (`fishserve.host_probe`, ms, higher is slower) right before and right after the
            level: with the server on the same machine, a host that slowed down during a run
            makes its levels incomparable (docs/benchmarks.md §6.27). None: not taken.
        cpu_busy, cpu_steal: shares of the load generator's machine's CPU time (all CPUs)
            that were busy, and that the hypervisor took from this (virtual) machine, over the
            level (`fishserve.bench.cpu_times`); None without psutil.
    """

    level: float
    requests: int
    ok: int
    errors: dict[str, int]
    duration_s: float
    latency_s: dict[str, float | None]
    ttfa_s: dict[str, float | None]
    rtf: dict[str, float | None]
    rtf_max: float | None
    requests_per_min: float
    audio_s_per_s: float
    frames_per_s: float
    stream_frames_per_s: float | None
    all_realtime: bool | None
    stalled_streams: int
    peak_gpu_bytes: int | None = None
    decoder_frames_per_s: float | None = None
    llm_busy: float | None = None
    decoder_busy: float | None = None
    steps_per_s: float | None = None
    frames_per_step: float | None = None
    full_sort_share: float | None = None
    decoder_frames_per_call: float | None = None
    decoder_frames_per_job: float | None = None
    gil_wait_ms: float | None = None
    boost_share: float | None = None
    server_ttfa_s: float | None = None
    queue_s: float | None = None
    first_chunk_decode_s: float | None = None
    first_chunk_frames: float | None = None
    mean_in_flight: float = 0.0
    sent_s: dict[str, float | None] | None = None
    ttfa_early_s: dict[str, float | None] | None = None
    ttfa_late_s: dict[str, float | None] | None = None
    ttfa_halves_n: tuple[int, int] | None = None
    host_probe_ms: float | None = None
    host_probe_after_ms: float | None = None
    cpu_busy: float | None = None
    cpu_steal: float | None = None


# Issue 8's capacity criteria: every stream real time without gaps, TTFA p99 within 300 ms;
# the stricter one also needs every stream at RTF <= 0.5.
TTFA_P99_LIMIT_S = 0.3
FAST_RTF = 0.5


def serves_realtime(summary: LevelSummary, ttfa_limit_s: float = TTFA_P99_LIMIT_S) -> bool:
    """Every request succeeded, none fell behind real time or stalled, TTFA p99 <= limit."""
    p99 = summary.ttfa_s["p99"]
    return (
        summary.requests > 0
        and summary.ok == summary.requests
        and bool(summary.all_realtime)
        and summary.stalled_streams == 0
        and p99 is not None
        and p99 <= ttfa_limit_s
    )


def capacity(
    levels: list[LevelSummary], ttfa_limit_s: float = TTFA_P99_LIMIT_S
) -> dict[str, float | None]:
    """The largest level up to which every level meets `serves_realtime` (a level that fails
    caps the answer even if a larger one passed), and the same with worst RTF <= 0.5.

    Returns:
        ``{"realtime": level or None, "rtf_0.5": level or None}``.
    """

    def largest(passes: Callable[[LevelSummary], bool]) -> float | None:
        best = None
        for summary in sorted(levels, key=lambda s: s.level):
            if not passes(summary):
                break
            best = summary.level
        return best

    def fast(s: LevelSummary) -> bool:
        return serves_realtime(s, ttfa_limit_s) and s.rtf_max is not None and s.rtf_max <= FAST_RTF

    return {
        "realtime": largest(lambda s: serves_realtime(s, ttfa_limit_s)),
        "rtf_0.5": largest(fast),
    }


# A level's TTFA is "still rising" when its second half's median exceeds the first half's by
# both this factor and this many seconds; the margin keeps the jitter of fast levels from
# counting. On the H200 (docs/benchmarks.md §6.15), 384 streams rose 0.19 -> 0.25 s in 15 s
# levels and 0.21 -> 0.26 s in 30 s levels (the 8 s ramp in their first half); 320 streams,
# 0.19 -> 0.22 s, did not count.
RISING_FACTOR = 1.2
RISING_MARGIN_S = 0.02
# Fewest successful requests with a TTFA in each half for the comparison: with a handful, the
# halves differ by their texts (the workload mixes languages and lengths), not by load.
RISING_MIN_REQUESTS = 20
# Shortest send window (first to last send, seconds) with halves to compare: a burst of
# requests sent at once has no "later" half.
RISING_MIN_WINDOW_S = 1.0


def halves(records: list[RequestRecord]) -> tuple[list[RequestRecord], list[RequestRecord]]:
    """`records` split at the middle of their send window (first to last `start_s`): those
    sent before it, and the rest (both empty for no records, or a window shorter than
    `RISING_MIN_WINDOW_S`)."""
    starts = [r.start_s for r in records]
    if not records or max(starts) - min(starts) < RISING_MIN_WINDOW_S:
        return [], []
    middle = (min(starts) + max(starts)) / 2
    return [r for r in records if r.start_s < middle], [r for r in records if r.start_s >= middle]


def still_rising(summary: LevelSummary) -> bool:
    """Whether the level's TTFA median rose from its first half to its second (by
    `RISING_FACTOR` and `RISING_MARGIN_S`, each half with at least `RISING_MIN_REQUESTS`
    TTFAs): the level ended before steady state."""
    counts = summary.ttfa_halves_n or (0, 0)
    early = (summary.ttfa_early_s or {}).get("p50")
    late = (summary.ttfa_late_s or {}).get("p50")
    if early is None or late is None or min(counts) < RISING_MIN_REQUESTS:
        return False
    return late > early * RISING_FACTOR and late - early > RISING_MARGIN_S


def level_duration(records: list[RequestRecord]) -> float:
    """Seconds from the first send to the last finish of `records` (0 if empty)."""
    if not records:
        return 0.0
    start = min(r.start_s for r in records)
    return max(r.start_s + r.latency_s for r in records) - start


def summarize(
    level: float,
    records: list[RequestRecord],
    frame_rate: float,
    peak_gpu_bytes: int | None = None,
) -> LevelSummary:
    """Summarize one level's records (`frame_rate`: audio frames per audio second)."""
    good = [r for r in records if r.ok]
    duration = level_duration(records)
    audio = sum(r.audio_s for r in good)
    rtfs = [r.rtf for r in good if r.rtf is not None]
    per_stream = [r.frames_per_s(frame_rate) for r in good]
    rate = 1.0 / duration if duration > 0 else 0.0
    early, late = halves(good)
    early_ttfa = [r.ttfa_s for r in early if r.ttfa_s is not None]
    late_ttfa = [r.ttfa_s for r in late if r.ttfa_s is not None]
    return LevelSummary(
        level=level,
        requests=len(records),
        ok=len(good),
        errors=dict(sorted(Counter(r.status for r in records if not r.ok).items())),
        duration_s=duration,
        latency_s=percentiles([r.latency_s for r in good]),
        ttfa_s=percentiles([r.ttfa_s for r in good if r.ttfa_s is not None]),
        rtf=percentiles(rtfs),
        rtf_max=max(rtfs) if rtfs else None,
        requests_per_min=60.0 * len(good) * rate,
        audio_s_per_s=audio * rate,
        frames_per_s=audio * frame_rate * rate,
        stream_frames_per_s=float(np.median(per_stream)) if per_stream else None,
        all_realtime=all(x <= 1.0 for x in rtfs) if rtfs else None,
        stalled_streams=sum(1 for r in good if (r.stall_s or 0.0) > 0.0),
        peak_gpu_bytes=peak_gpu_bytes,
        mean_in_flight=sum(r.latency_s for r in records) * rate,
        sent_s=percentiles([r.sent_s for r in good if r.sent_s is not None]),
        ttfa_early_s=percentiles(early_ttfa),
        ttfa_late_s=percentiles(late_ttfa),
        ttfa_halves_n=(len(early_ttfa), len(late_ttfa)),
    )
