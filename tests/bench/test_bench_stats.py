"""Per-level summaries: percentiles, throughput, errors by status, real-time flag."""

from __future__ import annotations

import pytest

from fishserve.bench.client import RequestRecord
from fishserve.bench.stats import percentiles, summarize


def rec(i: int, latency: float, audio: float, status: str = "200", start: float = 0.0):
    return RequestRecord(
        i, 4, "x", start, status, ttfa_s=latency / 4, latency_s=latency, audio_s=audio
    )


def test_percentiles_interpolate_and_handle_empty_input():
    assert percentiles([1.0, 2.0, 3.0, 4.0, 5.0]) == {
        "p50": 3.0,
        "p90": 4.6,
        "p99": pytest.approx(4.96),
    }
    assert percentiles([]) == {"p50": None, "p90": None, "p99": None}


def test_summary_counts_throughput_and_errors_by_status():
    records = [
        rec(0, 1.0, 2.0),
        rec(1, 2.0, 4.0, start=1.0),
        rec(2, 0.1, 0.0, "429"),
        rec(3, 5.0, 0.0, "timeout"),
    ]
    s = summarize(4, records, frame_rate=20.0, peak_gpu_bytes=123)
    assert (s.requests, s.ok, s.errors) == (4, 2, {"429": 1, "timeout": 1})
    assert s.duration_s == 5.0  # first send at 0, last finish at 0 + 5
    assert s.requests_per_min == pytest.approx(60 * 2 / 5)
    assert s.audio_s_per_s == pytest.approx(6 / 5)
    assert s.frames_per_s == pytest.approx(6 * 20 / 5)
    assert s.latency_s["p50"] == 1.5 and s.ttfa_s["p50"] == 0.375
    assert s.all_realtime is True and s.rtf_max == 0.5
    assert s.peak_gpu_bytes == 123


def test_one_slow_stream_breaks_real_time():
    s = summarize(1, [rec(0, 1.0, 2.0), rec(1, 3.0, 2.0)], frame_rate=20.0)
    assert s.all_realtime is False and s.rtf_max == 1.5


def test_no_success_gives_empty_percentiles():
    s = summarize(1, [rec(0, 1.0, 0.0, "503")], frame_rate=20.0)
    assert s.ok == 0 and s.latency_s["p50"] is None and s.all_realtime is None
    assert s.requests_per_min == 0


def test_ttfa_halves_split_the_send_window_and_flag_a_rising_level():
    from fishserve.bench.stats import RISING_MIN_REQUESTS, halves, still_rising, summarize

    def records(early_ttfa: float, late_ttfa: float, n: int = 50):
        # sends at 0..n-1 s: the window's middle is (n - 1) / 2 s
        return [
            RequestRecord(
                i,
                8,
                "x",
                float(i),
                "200",
                ttfa_s=early_ttfa if i < n // 2 else late_ttfa,
                latency_s=5.0,
                audio_s=10.0,
            )
            for i in range(n)
        ]

    first, second = halves(records(0.2, 0.2, n=10))
    assert [r.start_s for r in first] == [0, 1, 2, 3, 4] and len(second) == 5
    assert halves([]) == ([], [])
    burst = records(0.2, 0.9, n=64)
    for i, r in enumerate(burst):
        r.start_s = i * 1e-4  # all sent within 6 ms: no later half to compare
    assert halves(burst) == ([], [])
    assert not still_rising(summarize(64, burst, 21.5))
    rising = summarize(8, records(0.20, 0.26), 21.5)
    assert rising.ttfa_early_s["p50"] == 0.20 and rising.ttfa_late_s["p50"] == 0.26
    assert still_rising(rising)
    assert not still_rising(summarize(8, records(0.20, 0.23), 21.5))  # within 20 %
    assert not still_rising(summarize(8, records(0.05, 0.065), 21.5))  # within 20 ms
    assert not still_rising(summarize(8, records(0.30, 0.20), 21.5))  # falling is fine
    # a handful of requests per half differ by their texts, not by load: no verdict
    few = summarize(1, records(4.78, 5.99, n=2 * RISING_MIN_REQUESTS - 2), 21.5)
    assert few.ttfa_halves_n == (RISING_MIN_REQUESTS - 1,) * 2 and not still_rising(few)
    assert still_rising(summarize(1, records(4.78, 5.99, n=2 * RISING_MIN_REQUESTS), 21.5))
