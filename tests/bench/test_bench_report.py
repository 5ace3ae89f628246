"""The markdown summary table."""

from __future__ import annotations

from fishserve.bench.client import RequestRecord
from fishserve.bench.report import markdown_table
from fishserve.bench.stats import capacity, serves_realtime, summarize


def test_table_shows_errors_real_time_and_peak_memory():
    records = [
        RequestRecord(0, 8, "x", 0.0, "200", ttfa_s=0.5, sent_s=0.25, latency_s=3.0, audio_s=2.0),
        RequestRecord(1, 8, "x", 0.0, "429", latency_s=0.1),
        RequestRecord(2, 8, "x", 0.0, "429", latency_s=0.1),
    ]
    table = markdown_table([summarize(8, records, 21.5, peak_gpu_bytes=3 * 2**30)], "concurrency")
    header, rule, row = table.splitlines()
    assert header.count("|") == rule.count("|") == row.count("|") == 20
    assert "| 0.50 / 0.50 / 0.50 | 0.250 |" in row  # TTFA, then the client's own send time
    assert "| 8 | 3 | 1 | 429: 2 |" in row
    # no server counters (a peer server): decoder, GPU busy, step and first-chunk columns empty
    assert "no (max 1.50)" in row and row.endswith("| 3.00 | - | - / - | - / - | - | - |")
    summary = summarize(8, records, 21.5)
    summary.queue_s, summary.first_chunk_decode_s, summary.first_chunk_frames = 0.1, 0.05, 8
    assert markdown_table([summary], "concurrency").endswith("| 0.100 / 0.050 (8.0) |")


def level(n: int, ttfa_p99: float, rtf_max: float, stalled: int = 0, errors: int = 0):
    """A summary of n streams with the given worst TTFA and RTF."""
    records = [
        RequestRecord(i, n, "x", 0.0, "200", ttfa_s=ttfa_p99, latency_s=rtf_max * 10, audio_s=10)
        for i in range(n)
    ]
    records += [RequestRecord(n + i, n, "x", 0.0, "503", latency_s=0.1) for i in range(errors)]
    for r in records[:stalled]:
        r.stall_s = 0.2
    return summarize(n, records, 21.5)


def test_capacity_is_the_largest_level_meeting_every_criterion():
    levels = [
        level(64, 0.1, 0.3),
        level(128, 0.2, 0.45),
        level(256, 0.25, 0.8),
        level(512, 0.29, 0.9, stalled=1),  # a gap: not real time
        level(768, 0.5, 0.9),  # TTFA p99 too high
        level(1024, 0.2, 1.2),  # slower than real time
    ]
    assert capacity(levels) == {"realtime": 256, "rtf_0.5": 128}
    assert capacity([level(8, 0.1, 0.3, errors=1)]) == {"realtime": None, "rtf_0.5": None}
    # a failing level caps the answer even if a larger one passed (noise, not capacity)
    assert capacity([level(64, 0.1, 0.3), level(128, 0.5, 0.3), level(256, 0.1, 0.3)]) == {
        "realtime": 64,
        "rtf_0.5": 64,
    }
    assert serves_realtime(level(8, 0.1, 0.3)) and not serves_realtime(level(8, 0.31, 0.3))


def test_server_rates_from_two_metrics_reads():
    from fishserve.bench.server_counters import parse_counters, rates

    def exposition(frames: float, steps: float, decoded: float, llm: float) -> str:
        return "\n".join(
            [
                "# TYPE fishserve:decoder_calls_total counter",
                f"fishserve:decoder_calls_total {decoded / 25}",
                "# TYPE fishserve:decoder_jobs_total counter",
                f"fishserve:decoder_jobs_total {decoded / 10}",
                "# TYPE fishserve:sampler_full_sort_rows_total counter",
                f"fishserve:sampler_full_sort_rows_total {frames / 10}",
                "# TYPE fishserve:generation_frames_total counter",
                f"fishserve:generation_frames_total {frames}",
                "# TYPE fishserve:engine_steps_total counter",
                f"fishserve:engine_steps_total {steps}",
                "# TYPE fishserve:engine_boost_steps_total counter",
                f"fishserve:engine_boost_steps_total {steps / 5}",
                "# TYPE fishserve:decoder_frames_total counter",
                f"fishserve:decoder_frames_total {decoded}",
                "# TYPE fishserve:gpu_busy_seconds_total counter",
                f'fishserve:gpu_busy_seconds_total{{component="llm"}} {llm}',
                "# TYPE fishserve:gil_wait_seconds counter",
                f"fishserve:gil_wait_seconds_total {steps * 2e-4}",
                "# TYPE fishserve:gil_probe_wakeups counter",
                f"fishserve:gil_probe_wakeups_total {steps}",
                "",
            ]
        )

    before = parse_counters(exposition(100, 10, 50, 1.0))
    after = parse_counters(exposition(1100, 60, 1050, 3.0))
    got = rates(before, after, seconds=2.0)
    assert got.steps_per_s == 25 and got.frames_per_step == 20  # 1,000 frames in 50 steps
    assert got.decoder_frames_per_s == 500 and got.llm_busy == 1.0
    assert got.decoder_frames_per_call == 25  # 1,000 frames in 40 calls
    assert got.decoder_frames_per_job == 10  # 1,000 frames in 100 chunks
    assert got.decoder_busy is None  # not exported by this server
    assert abs(got.full_sort_share - 0.1) < 1e-12  # 100 of 1,000 frames
    assert abs(got.gil_wait_ms - 0.2) < 1e-9  # 0.01 s waited over 50 wake-ups
    assert abs(got.boost_share - 0.2) < 1e-12  # 10 of 50 steps
    assert rates({}, after, 2.0).frames_per_step is None  # a server without the counters


def test_server_rates_split_the_first_chunk_from_the_servers_own_histograms():
    """Level means of the first-chunk histograms come from the server's real metric names,
    counting only the level's observations."""
    from prometheus_client import generate_latest

    from fishserve.bench.server_counters import parse_counters, rates
    from fishserve.server.metrics import Metrics

    metrics = Metrics()

    def observe(ttfa: float, queue: float, decode: float, frames: int) -> None:
        metrics.ttfa.observe(ttfa)
        metrics.queue_time.observe(queue)
        metrics.first_chunk_decode.observe(decode)
        metrics.first_chunk_frames.observe(frames)

    observe(9.0, 9.0, 9.0, 64)  # before the level: not counted
    before = parse_counters(generate_latest(metrics.registry).decode())
    observe(0.2, 0.1, 0.05, 10)
    observe(0.4, 0.1, 0.15, 6)
    got = rates(before, parse_counters(generate_latest(metrics.registry).decode()), 1.0)
    assert abs(got.server_ttfa_s - 0.3) < 1e-9 and abs(got.queue_s - 0.1) < 1e-9
    assert abs(got.first_chunk_decode_s - 0.1) < 1e-9 and got.first_chunk_frames == 8
    assert rates(before, before, 1.0).queue_s is None  # no request in the level


def test_the_verdict_names_levels_where_the_load_generator_was_slow_to_send():
    from fishserve.bench.report import BenchReport, capacity_lines

    def at(n: int, sent: float):
        records = [
            RequestRecord(i, n, "x", 0.0, "200", ttfa_s=0.2, sent_s=sent, latency_s=5, audio_s=10)
            for i in range(n)
        ]
        return summarize(n, records, 21.5)

    meta = {"mode": "concurrency"}
    quick = capacity_lines(BenchReport(meta, [at(8, 0.01), at(16, 0.02)], [], []))
    assert len(quick) == 2 and not any("load generator" in line for line in quick)
    slow = capacity_lines(BenchReport(meta, [at(8, 0.01), at(16, 2.5)], [], []))
    assert "load generator" in slow[-1] and "16 (2.50 s)" in slow[-1] and "8 (" not in slow[-1]


def test_verdict_warns_about_a_level_whose_ttfa_was_still_rising():
    from fishserve.bench.report import steady_lines

    def rising_level(n: int, late_ttfa: float):
        records = [
            RequestRecord(
                i,
                n,
                "x",
                float(i),
                "200",
                ttfa_s=0.2 if i < 2 * n else late_ttfa,
                latency_s=5.0,
                audio_s=10.0,
            )
            for i in range(4 * n)  # at least 20 requests in each half
        ]
        return summarize(n, records, 21.5)

    assert steady_lines([rising_level(16, 0.21), rising_level(32, 0.22)]) == []
    (line,) = steady_lines([rising_level(16, 0.21), rising_level(32, 0.5)])
    assert "steady state" in line and "32 (p50 0.20 -> 0.50 s, second half's p99 0.50 s)" in line
    assert "16 (" not in line

    # open loop (Poisson): a rising TTFA is a growing queue, not a short level
    from fishserve.bench.report import BenchReport, capacity_lines

    levels = [rising_level(32, 0.5)]
    assert any(
        "steady state" in x
        for x in capacity_lines(BenchReport({"mode": "concurrency"}, levels, [], []))
    )
    assert capacity_lines(BenchReport({"mode": "poisson"}, levels, [], [])) == []


def test_every_server_rate_has_its_level_summary_field():
    """`fishserve bench` copies each `ServerRates` field into the level's summary by name."""
    from dataclasses import fields

    from fishserve.bench.server_counters import ServerRates
    from fishserve.bench.stats import LevelSummary

    summary_fields = {f.name for f in fields(LevelSummary)}
    assert {f.name for f in fields(ServerRates)} <= summary_fields


def test_verdict_warns_when_the_host_slowed_down_between_levels():
    from fishserve.bench.report import BenchReport, capacity_lines, host_lines

    def probed(n: int, before: float | None, after: float | None):
        summary = level(n, 0.2, 0.5)
        summary.host_probe_ms, summary.host_probe_after_ms = before, after
        return summary

    steady = [probed(64, 5.0, 5.4), probed(128, 5.2, 7.5)]
    assert host_lines(steady) == []  # within 1.6x of the fastest: probe noise
    assert host_lines([probed(64, None, None)]) == []  # not taken (an old report)
    slowed = [probed(64, 5.0, 5.2), probed(128, 5.1, 9.8), probed(256, 11.0, 12.0)]
    (line,) = host_lines(slowed)
    assert "host speed changed" in line and "5.0 to 12.0 ms" in line
    assert "after level 128, 256." in line and "64," not in line
    verdict = capacity_lines(BenchReport({"mode": "concurrency"}, slowed, [], []))
    assert verdict[-1] == line


def test_verdict_names_the_levels_whose_cpu_the_hypervisor_took():
    from fishserve.bench.report import host_lines

    quiet, stolen = level(64, 0.2, 0.5), level(128, 0.2, 0.5)
    quiet.cpu_steal, stolen.cpu_steal = 0.01, 0.22
    (line,) = host_lines([quiet, stolen])
    assert "hypervisor" in line and "128 (22%)" in line and "64 (" not in line
    stolen.cpu_steal = None  # /proc/stat unreadable
    assert host_lines([quiet, stolen]) == []
