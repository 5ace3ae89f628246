"""The markdown summary table."""

from __future__ import annotations

from fishserve.bench.client import RequestRecord
from fishserve.bench.report import markdown_table
from fishserve.bench.stats import summarize


def test_table_shows_errors_real_time_and_peak_memory():
    records = [
        RequestRecord(0, 8, "x", 0.0, "200", ttfa_s=0.5, latency_s=3.0, audio_s=2.0),
        RequestRecord(1, 8, "x", 0.0, "429", latency_s=0.1),
        RequestRecord(2, 8, "x", 0.0, "429", latency_s=0.1),
    ]
    table = markdown_table([summarize(8, records, 21.5, peak_gpu_bytes=3 * 2**30)], "concurrency")
    header, rule, row = table.splitlines()
    assert header.count("|") == rule.count("|") == row.count("|") == 14
    assert "| 8 | 3 | 1 | 429: 2 |" in row
    assert "no (max 1.50)" in row and row.endswith("| 3.00 |")
