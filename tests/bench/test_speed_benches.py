"""The speed commands run end to end on CPU with the tiny fixtures and report what they measure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from fishserve.cli import app

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


TINY_ENGINE = ["bench-engine", "--checkpoint", str(FIXTURES / "tiny_t2s"), "--device", "cpu"]


def run(args: list[str]) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output


def test_bench_sampler_reports_when_the_prefilter_decides(tmp_path: Path) -> None:
    out = tmp_path / "sampler.json"
    run(["bench-sampler", "--device", "cpu", "--batch-sizes", "1,4", "--repeats", "1"])
    run(["bench-sampler", "--device", "cpu", "--batch-sizes", "4", "--repeats", "1",
         "--top-k-prefilter", "64", "--output", str(out)])  # fmt: skip
    rows = {r["logits"]: r for r in json.loads(out.read_text())}
    assert rows["peaked"]["exact_rows"] == 1.0  # nucleus inside 64 candidates
    assert rows["flat"]["exact_rows"] == 0.0  # near-uniform: every row falls back
    assert all(r["full_ms"] > 0 and r["prefilter_ms"] > 0 for r in rows.values())


def test_bench_decoder_compares_eager_and_runner(tmp_path: Path) -> None:
    out = tmp_path / "decoder.json"
    decoder = FIXTURES / "tiny_decoder"
    run(["bench-decoder", "--device", "cpu", "--dtypes", "fp32", "--batch-sizes", "1,2",
         "--chunk", "8", "--repeats", "1", "--decoder-checkpoint", str(decoder / "generator.pth"),
         "--decoder-config", str(decoder / "config.json"), "--output", str(out)])  # fmt: skip
    results = json.loads(out.read_text())
    assert [(r["mode"], r["batch"]) for r in results] == [
        ("eager", 1), ("eager", 2), ("graphs", 1), ("graphs", 2)
    ]  # fmt: skip
    assert all(r["frames_per_s"] > 0 and r["context"] == 25 for r in results)
    frame_rate = 44100 / 256  # the tiny decoder: 256 samples per code frame
    for r in results:
        assert r["realtime_streams"] == pytest.approx(r["frames_per_s"] / frame_rate)
    assert out.with_suffix(".md").read_text().count("\n| ") == 4  # one row per point


def test_bench_decoder_whole_clips_have_no_context(tmp_path: Path) -> None:
    out = tmp_path / "clips.json"
    decoder = FIXTURES / "tiny_decoder"
    run(["bench-decoder", "--device", "cpu", "--dtypes", "fp32", "--batch-sizes", "2",
         "--chunk", "30", "--repeats", "1", "--modes", "eager,graphs", "--whole-clips",
         "--decoder-checkpoint", str(decoder / "generator.pth"),
         "--decoder-config", str(decoder / "config.json"), "--output", str(out)])  # fmt: skip
    results = json.loads(out.read_text())
    assert [(r["mode"], r["context"], r["chunk"]) for r in results] == [
        ("eager", 0, 30), ("graphs", 0, 30)
    ]  # fmt: skip


def test_bench_decoder_mixes_chunk_lengths(tmp_path: Path) -> None:
    """`--chunk 3,9`: the jobs of a call take the lengths in turn (a lone job the first);
    frames/s counts them all."""
    out = tmp_path / "mixed.json"
    decoder = FIXTURES / "tiny_decoder"
    run(["bench-decoder", "--device", "cpu", "--dtypes", "fp32", "--batch-sizes", "1,3",
         "--chunk", "3,9", "--repeats", "1", "--modes", "eager",
         "--decoder-checkpoint", str(decoder / "generator.pth"),
         "--decoder-config", str(decoder / "config.json"), "--output", str(out)])  # fmt: skip
    alone, result = json.loads(out.read_text())
    assert alone["chunks"] == [3] and alone["chunk"] == 3
    assert result["chunks"] == [3, 9] and result["chunk"] == 9
    seconds = result["ms_per_call"] / 1e3
    assert result["frames_per_s"] == pytest.approx((3 + 9 + 3) / seconds)
    assert "3,9" in out.with_suffix(".md").read_text()


def test_bench_engine_runs_on_the_tiny_model(tmp_path: Path) -> None:
    out = tmp_path / "engine.json"
    run(["bench-engine", "--checkpoint", str(FIXTURES / "tiny_t2s"), "--device", "cpu",
         "--modes", "eager", "--batch-sizes", "1,2", "--context", "20", "--frames", "3",
         "--kv-cache-dtypes", "fp32", "--output", str(out)])  # fmt: skip
    data = json.loads(out.read_text())
    assert [r["batch"] for r in data["results"]] == [1, 2]
    assert all(r["ms_per_step"] > 0 for r in data["results"]) and data["ttff_ms"] > 0
    assert all(r["profile"] is None for r in data["results"])


def test_bench_engine_kv_dtype_defaults_to_the_weights_dtype(tmp_path: Path) -> None:
    """Without --kv-cache-dtypes the KV cache is `auto` (fp32 weights on a CPU: fp32), as in
    `serve`, and the table names the resolved dtype and real-time streams to 0.1."""
    out = tmp_path / "engine.json"
    run(["bench-engine", "--checkpoint", str(FIXTURES / "tiny_t2s"), "--device", "cpu",
         "--modes", "eager", "--batch-sizes", "1", "--context", "20", "--frames", "2",
         "--output", str(out)])  # fmt: skip
    (point,) = json.loads(out.read_text())["results"]
    assert point["kv_cache_dtype"] == "fp32"
    row = next(line for line in out.with_suffix(".md").read_text().splitlines() if "fp32" in line)
    assert f"{point['realtime_streams']:,.1f}" in row


def test_bench_engine_profiles_steps_on_request(tmp_path: Path) -> None:
    out = tmp_path / "engine.json"
    run(["bench-engine", "--checkpoint", str(FIXTURES / "tiny_t2s"), "--device", "cpu",
         "--modes", "eager", "--batch-sizes", "2", "--context", "20", "--frames", "2",
         "--kv-cache-dtypes", "fp32", "--profile-steps", "2", "--output", str(out)])  # fmt: skip
    (point,) = json.loads(out.read_text())["results"]
    assert point["profile"]["wall_ms"] > 0 and point["profile"]["kernels"] == 0  # no GPU here
    table = (tmp_path / "engine_profile_fp32_eager_b2.txt").read_text()
    assert "aten::" in table and "Self CPU" in table  # operators by host time on the CPU
    assert "GPU span ms" in out.with_suffix(".md").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["bench-sampler", "--top-k-prefilter", "200000"], "below the vocabulary"),
        (["bench-sampler", "--batch-sizes", "-1"], "--batch-sizes"),
        (["bench-sampler", "--batch-sizes", "1.5"], "whole numbers"),
        (["bench-decoder", "--dtypes", "fp64"], "--dtypes"),
        (["bench-decoder", "--batch-sizes", "0"], "--batch-sizes"),
        (["bench-decoder", "--modes", "fast"], "--modes"),
        (["bench-decoder", "--device", "cpu", "--modes", "triton"], "need a CUDA device"),
        (["bench-decoder", "--device", "cpu", "--modes", "triton-pipelined"], "need a CUDA"),
        (["bench-engine", "--modes", "bogus"], "--modes"),
        (["bench-engine", "--kv-cache-dtypes", "int4"], "--kv-cache-dtypes"),
        ([*TINY_ENGINE, "--context", "50", "--frames", "1000"], "the model's context is 256"),
        ([*TINY_ENGINE, "--output", "be.wav"], "has extension '.wav'; use one of .json"),
        (["bench-decoder", "--output", "/nonexistent/d.json"], "folder /nonexistent does not"),
        (["bench-sampler", "--output", "/proc/s.json"], "cannot write there"),
        (["bench", "--ramp", "inf"], "--ramp"),
        (["bench", "--mode", "poisson", "--ramp", "2"], "--ramp"),
        (["bench", "--url", "notaurl"], "--url"),
        (["bench", "--url", "http://127.0.0.1:port"], "--url: bad port"),
    ],
)
def test_bad_values_give_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "error:" in result.output and message in result.output
    assert "Traceback" not in result.output


def test_bench_refuses_an_unusable_output_dir_before_running(tmp_path: Path) -> None:
    """A report folder under a file fails at once (exit 2), not after the whole load test."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = CliRunner().invoke(app, ["bench", "--output-dir", str(blocker / "out")])
    assert result.exit_code == 2, result.output
    assert "error:" in result.output and "Not a directory" in result.output
    assert "Traceback" not in result.output


def test_mixed_steps_times_decode_and_arrival_steps(tiny_model, tiny_tokenizer) -> None:
    from fishserve.bench.mixed_steps import run as run_mixed

    result = run_mixed(2, tiny_model, tiny_tokenizer)
    assert set(result) == {"decode", "mixed1", "mixed4", "after"}
    assert all(r["median_ms"] > 0 and r["mean_ms"] > 0 for r in result.values())


def test_mixed_steps_rejects_bad_batch_sizes(monkeypatch, capsys) -> None:
    from fishserve.bench.mixed_steps import main as mixed_main

    monkeypatch.setattr("sys.argv", ["mixed_steps", "--batch-sizes", "1,x"])
    with pytest.raises(SystemExit) as info:
        mixed_main()
    assert info.value.code == 2
    assert "--batch-sizes" in capsys.readouterr().err


def test_profile_steps_needs_a_step_and_counts_each_call() -> None:
    from fishserve.bench.step_profile import profile_steps

    with pytest.raises(ValueError, match="at least one step"):
        profile_steps(lambda: None, 0)
    calls = []
    profiled = profile_steps(lambda: calls.append(torch.ones(8).sum()), 3)
    assert len(calls) == 3 and profiled.wall_ms > 0 and "aten::sum" in profiled.table


def test_pipelined_calls_decode_every_call_and_free_their_buffers(tiny_decoder) -> None:
    from fishserve.audio.decoder_runner import DecoderRunner
    from fishserve.bench.decoder_speed import decode_pipelined, make_jobs

    runner = DecoderRunner(tiny_decoder, max_batch=2, frame_buckets=(16,))
    jobs = make_jobs(tiny_decoder, 2, [8])
    decode_pipelined(runner, jobs, 5)
    assert runner.calls == 5 and runner.jobs_decoded == 10
    assert len(runner.decode_jobs(jobs)) == 2  # every call's buffers came back


def test_bench_engine_async_mode_launches_ahead_on_the_cpu(
    tiny_model, tiny_tokenizer, monkeypatch
) -> None:
    """`--modes async` on a CPU runs asynchronous (static) steps, not sync ones so labelled."""
    from fishserve.bench.engine_speed import bench_config
    from fishserve.engine.runner import ModelRunner

    launched = []
    launch = ModelRunner.launch
    monkeypatch.setattr(
        ModelRunner, "launch", lambda self, *a, **k: launched.append(1) or launch(self, *a, **k)
    )
    results = bench_config(tiny_model, tiny_tokenizer, "fp32", "async", [2], 20, 6)
    assert results[0].frames_per_s > 0 and len(launched) >= 6
