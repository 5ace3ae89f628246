"""`fishserve bench` against a live tiny-fixture server on 127.0.0.1: a bounded run writes a
well-formed report without errors, in both modes and both APIs, and from the CLI."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from bench_server import TINY_FRAME_RATE, free_port, tiny_server
from rich.console import Console
from typer.testing import CliRunner

from fishserve.bench.report import BenchReport
from fishserve.bench.run import BenchOptions, run_bench
from fishserve.bench.workload import RequestShape, builtin_workload
from fishserve.cli import app

FRAMES = 6  # per request, with ignore_eos: 5 audio frames (the first is not audio)
SAMPLES_PER_FRAME = 256  # tiny decoder
EXPECTED_AUDIO_S = (FRAMES - 1) * SAMPLES_PER_FRAME / 44100
PLOTS = ("latency.png", "throughput.png", "memory.png", "capacity.png")


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with tiny_server(tmp_path_factory.mktemp("voices")) as base_url:
        yield base_url


def options(url: str, out: Path, **overrides: object) -> BenchOptions:
    settings: dict[str, object] = {
        "url": url,
        # Short texts only: the tiny model's context is 256 positions.
        "workload": builtin_workload(("short",), ("en", "zh")),
        "shape": RequestShape(max_new_tokens=FRAMES, ignore_eos=True),
        "levels": [1, 3],
        "num_requests": 6,
        "duration_s": 20.0,
        "warmup": 1,
        "timeout_s": 30.0,
        "frame_rate": TINY_FRAME_RATE,
        "poll_interval_s": 0.05,
        "output_dir": out,
    }
    settings.update(overrides)
    return BenchOptions(**settings)  # type: ignore[arg-type]


def check_outputs(out: Path, levels: int) -> dict:
    data = json.loads((out / "bench.json").read_text())
    assert len(data["levels"]) == levels
    for name in PLOTS:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (out / "bench.md").read_text()
    assert table.count("\n| ") == levels + 1  # header + one row per level
    assert data["meta"]["host_probe_ms"] > 0
    assert f"host probe: {data['meta']['host_probe_ms']:.1f} ms" in table
    server_probe = data["meta"]["server"]["host_probe_ms"]  # the server's, from /health
    assert f"host_probe={server_probe:.1f} ms" in table
    for level in data["levels"]:  # each level's own host probes and CPU time split
        assert level["host_probe_ms"] > 0 and level["host_probe_after_ms"] > 0
        assert 0 <= level["cpu_steal"] <= level["cpu_steal"] + level["cpu_busy"] <= 1
    return data


def assert_clean(report: BenchReport, requests_per_level: int) -> None:
    for summary in report.levels:
        assert summary.errors == {} and summary.ok == summary.requests == requests_per_level
        assert summary.latency_s["p50"] > 0 and summary.requests_per_min > 0
        assert summary.ttfa_s["p99"] <= summary.latency_s["p99"] + 1e-9
        assert summary.sent_s is not None and summary.sent_s["p99"] is not None
    for record in report.requests:
        assert record.ok and record.audio_s == pytest.approx(EXPECTED_AUDIO_S)
        # sent over a real connection before its first audio came back
        assert record.sent_s is not None and 0 < record.sent_s < record.ttfa_s


def test_concurrency_sweep_writes_a_clean_report(url, tmp_path):
    report = run_bench(options(url, tmp_path), Console(file=None, quiet=True))
    assert_clean(report, 6)
    assert [s.level for s in report.levels] == [1, 3]
    data = check_outputs(tmp_path, 2)
    assert data["meta"]["server"]["status"] == "ok"
    assert data["meta"]["server_summary"].startswith("device=cpu")
    assert data["memory"] and {m["level"] for m in data["memory"]} >= {1, 3}
    assert all(r["status"] == "200" and r["rtf"] > 0 for r in data["requests"])
    # the server's own counters: decoder frames and GPU (here: CPU) busy time per component
    for summary in report.levels:
        assert summary.decoder_frames_per_s is not None and summary.decoder_frames_per_s > 0
        assert summary.llm_busy is not None and summary.llm_busy > 0
        assert summary.decoder_busy is not None and summary.decoder_busy > 0
    assert "**capacity (real time)**" in (tmp_path / "bench.md").read_text()


def test_poisson_mode_and_openai_api(url, tmp_path):
    shape = RequestShape(api="openai")  # the OpenAI route has no frame cap: one request
    opts = options(url, tmp_path, mode="poisson", levels=[20.0], num_requests=1, shape=shape)
    report = run_bench(opts, Console(quiet=True))
    summary = report.levels[0]
    assert summary.errors == {} and summary.ok == 1 and report.requests[0].audio_s > 0
    check_outputs(tmp_path, 1)


def test_cli_bench_runs_and_unreachable_server_exits_2(url, tmp_path):
    args = [
        "bench", "--url", url, "--concurrency", "2", "--num-requests", "2", "--warmup", "0",
        "--lengths", "short", "--languages", "en", "--max-new-tokens", str(FRAMES),
        "--ignore-eos", "--frame-rate", str(TINY_FRAME_RATE), "--output-dir", str(tmp_path),
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert check_outputs(tmp_path, 1)["levels"][0]["ok"] == 2
    refused = [*args[:-1], str(tmp_path / "refused"), "--extra-body", '{"bogus": 1}']
    result = CliRunner().invoke(app, refused)  # every request gets a 422
    assert result.exit_code == 1 and "no request succeeded" in result.output
    dead = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(app, ["bench", "--url", dead, "--output-dir", str(tmp_path / "x")])
    assert result.exit_code == 2 and "cannot reach" in result.output


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--concurrency", "100000000"], "--concurrency: at most 16,384 streams"),
        (["--concurrency", "0"], "--concurrency: expected positive numbers"),
        (["--sample-rate", "0"], "--sample-rate must be a positive number"),
        (["--frame-rate", "nan"], "--frame-rate must be a positive number"),
        (["--frame-rate", "-5"], "--frame-rate must be a positive number"),
    ],
)
def test_bad_bench_options_are_refused_before_anything_is_made(tmp_path, option, message):
    """A huge concurrency made every HTTP client up front (21 GB, deaf to Ctrl-C); a zero
    sample rate divided by zero; nothing is sent and no report folder is left behind."""
    out = tmp_path / "report"
    args = ["bench", "--url", "http://127.0.0.1:9", "--output-dir", str(out), *option]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and message in result.output, result.output
    assert not out.exists()


def test_requests_spread_over_several_http_clients(url, tmp_path, monkeypatch):
    """Above `REQUESTS_PER_CLIENT` streams the requests go through several clients (one pool
    for hundreds of streams stalled the load generator), and the run stays clean."""
    import fishserve.bench.client as client_module
    import fishserve.bench.shares as shares_module

    used: list[int] = []
    send = shares_module.send_request

    async def counting(client, *args, **kwargs):
        used.append(id(client))
        return await send(client, *args, **kwargs)

    monkeypatch.setattr(client_module, "REQUESTS_PER_CLIENT", 2)
    monkeypatch.setattr(shares_module, "send_request", counting)
    report = run_bench(options(url, tmp_path, levels=[3]), Console(quiet=True))
    assert_clean(report, 6)
    assert len(set(used)) == 2  # ceil(3 / 2) clients, each used


def test_several_processes_send_each_levels_share_of_the_requests(url, tmp_path):
    """Two load processes: every request of the level once, each with its one-process text."""
    report = run_bench(options(url, tmp_path, levels=[3], processes=2), Console(quiet=True))
    assert_clean(report, 6)
    assert sorted(r.index for r in report.requests) == list(range(6))
    workload = builtin_workload(("short",), ("en", "zh"))
    for record in report.requests:
        assert record.category == workload[record.index % len(workload)].category
    assert report.levels[0].mean_in_flight > 0


def test_shares_split_levels_and_requests_evenly():
    from fishserve.bench.shares import share_counts, share_plan

    assert share_counts(7, 3) == [3, 2, 2] and share_counts(2, 4) == [1, 1, 0, 0]
    with pytest.raises(ValueError):
        share_counts(5, 0)
    opts = options("http://127.0.0.1:1", Path("."), num_requests=10, ramp_s=4.0)
    plans = [share_plan(opts, 5, k, 2) for k in range(2)]
    assert [(p.level, p.num_requests) for p in plans] == [(3, 5), (2, 5)]
    assert all(p.ramp_s == 4.0 and p.duration_s == opts.duration_s for p in plans)
    poisson = options("http://127.0.0.1:1", Path("."), mode="poisson", num_requests=9)
    assert share_plan(poisson, 6.0, 1, 3).level == 2.0


def test_without_matplotlib_the_reports_are_written_and_the_plots_skipped(
    url, tmp_path, monkeypatch
):
    import io

    import fishserve.bench.run as bench_run

    def no_matplotlib(*args: object, **kwargs: object) -> list[Path]:
        raise ImportError("plots need matplotlib: pip install -e '.[bench]'")

    monkeypatch.setattr(bench_run, "write_plots", no_matplotlib)
    (tmp_path / "latency.png").write_bytes(b"\x89PNG an earlier run's")  # not this run's
    (tmp_path / "notes.png").write_bytes(b"\x89PNG the user's own")
    out = io.StringIO()
    report = run_bench(options(url, tmp_path, levels=[1]), Console(file=out, width=200))
    assert report.levels[0].ok == report.levels[0].requests > 0
    assert (tmp_path / "bench.json").exists() and (tmp_path / "bench.md").exists()
    assert not (tmp_path / "latency.png").exists() and (tmp_path / "notes.png").exists()
    assert (
        "plots skipped (plots need matplotlib: pip install -e '.[bench]'); removed 1 plot of an "
        "earlier run there" in out.getvalue()
    )
