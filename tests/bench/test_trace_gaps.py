"""`fishserve profile-gaps`: idle gaps of a stream in a Chrome trace, and who caused them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fishserve.bench.trace_gaps import ALL_STREAMS, analyse, gap_bins, render
from fishserve.cli import app


def kernel(name: str, ts: float, dur: float, stream: int, corr: int) -> dict:
    args = {"stream": stream, "correlation": corr}
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": args}


def launch(name: str, ts: float, corr: int) -> dict:
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": name,
        "ts": ts,
        "dur": 2.0,
        "args": {"correlation": corr},
    }


def write(tmp_path: Path, events: list[dict]) -> Path:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    """Stream 7: kernels at 0-10, 12-20 (overlapping 15-18), 300-310, 1310-1320 us.

    The kernel at 300 was launched at 250 (after the stream went idle at 20: host-bound);
    the one at 1310 at 100 (long before: queued). Stream 9: one short kernel.
    """
    return write(
        tmp_path,
        [
            launch("cudaGraphLaunch", -5.0, 1),
            kernel("a", 0.0, 10.0, 7, 1),
            kernel("b", 12.0, 8.0, 7, 1),
            kernel("b2", 15.0, 3.0, 7, 1),
            launch("cudaGraphLaunch", 250.0, 2),
            kernel("c", 300.0, 10.0, 7, 2),
            launch("cudaLaunchKernel", 100.0, 3),
            kernel("d", 1310.0, 10.0, 7, 3),
            kernel("e", 5.0, 1.0, 9, 4),
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 5.0},
        ],
    )


def test_busy_span_and_gaps_of_the_busiest_stream(trace: Path) -> None:
    uses = analyse(trace)
    main = uses[1]
    assert [u.stream for u in uses] == [ALL_STREAMS, 7, 9]
    assert main.busy_ms == pytest.approx(0.038)  # 10 + 8 + 10 + 10 us (b2 inside b)
    assert main.span_ms == pytest.approx(1.320)
    assert [g.length_ms for g in main.gaps] == pytest.approx([0.002, 0.280, 1.000])
    assert [g.host_bound for g in main.gaps] == [False, True, False]
    assert main.gaps[1].launch == "cudaGraphLaunch" and main.gaps[1].after == "c"
    assert main.gaps[0].before == "a" and main.gaps[1].before == "b"


def test_gap_bins_split_by_length_and_cause(trace: Path) -> None:
    gaps = analyse(trace)[1].gaps
    bins = {label: (n, total, bound) for label, n, total, bound in gap_bins(gaps)}
    assert bins["0-5 us"] == (1, pytest.approx(0.002), 0.0)
    assert bins["100-500 us"] == (1, pytest.approx(0.28), pytest.approx(0.28))
    assert bins[">= 500 us"] == (1, pytest.approx(1.0), 0.0)


def test_cli_prints_the_report(trace: Path) -> None:
    result = CliRunner().invoke(app, ["profile-gaps", str(trace), "--top", "1"])
    assert result.exit_code == 0, result.output
    assert "all streams: 3 gaps" in result.output  # stream 9's kernel (5-6 us) lies in a's
    assert "0.28 ms of it host-bound" in result.output
    longest = [line for line in result.output.splitlines() if " ms at " in line]
    assert len(longest) == 1 and "queued" in longest[0] and "c -> d" in longest[0]


def test_report_of_an_idle_free_stream(tmp_path: Path) -> None:
    uses = analyse(write(tmp_path, [kernel("a", 0.0, 5.0, 1, 1), kernel("b", 5.0, 5.0, 1, 2)]))
    assert uses[0].gaps == [] and uses[0].idle_ms == pytest.approx(0.0)
    assert "0 gaps" in render(uses, 5)


def test_one_streams_gap_filled_by_another_is_no_device_gap(tmp_path: Path) -> None:
    """A graph's kernels on two streams: stream 1 waits while stream 2 works."""
    events = [kernel("a", 0.0, 10.0, 1, 1), kernel("b", 10.0, 80.0, 2, 1)]
    events += [kernel("c", 90.0, 10.0, 1, 1)]
    uses = analyse(write(tmp_path, events))
    device, streams = uses[0], {u.stream: u for u in uses[1:]}
    assert device.gaps == [] and device.busy_ms == pytest.approx(0.1)
    assert [g.length_ms for g in streams[1].gaps] == pytest.approx([0.08])


def test_malformed_events_are_skipped(tmp_path: Path) -> None:
    """Non-object args, NaN or boolean times, negative durations: ignored, not a crash."""
    events = [
        kernel("a", 0.0, 10.0, 1, 1),
        {"ph": "X", "cat": "kernel", "name": "x", "ts": 1, "dur": 2, "args": [1]},
        {"ph": "X", "cat": "cuda_runtime", "name": "y", "ts": 1, "args": "z"},
        dict(kernel("nan", 0.0, 1.0, 1, 2), ts=float("nan")),
        dict(kernel("bool", 0.0, 1.0, 1, 3), ts=True),
        dict(kernel("neg", 20.0, -5.0, 1, 4)),
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))  # NaN written as JSON's NaN
    uses = analyse(path)
    assert uses[1].activities == 2 and uses[1].span_ms == pytest.approx(0.02)


def test_a_gzipped_trace_is_read(trace: Path) -> None:
    import gzip

    packed = trace.with_suffix(".json.gz")
    packed.write_bytes(gzip.compress(trace.read_bytes()))
    assert [u.stream for u in analyse(packed)] == [ALL_STREAMS, 7, 9]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[" * 200_000, "cannot read"),
        ("not json", "cannot read"),
        ('{"other": 1}', "no traceEvents"),
        ('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": 1}]}', "no device activities"),
    ],
)
def test_bad_traces_are_clear_errors(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "t.json"
    path.write_text(content)
    result = CliRunner().invoke(app, ["profile-gaps", str(path)])
    assert result.exit_code == 2 and message in result.output
