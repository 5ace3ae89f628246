"""`fishserve bench-engine-load`: the engine alone with N streams kept in flight."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from fishserve.bench.engine_load import (
    FRAMES_PER_SECOND,
    LoadPoint,
    LoadSettings,
    _Tracker,
    load_engine,
    notes,
    prompt_positions,
    run_load_point,
)
from fishserve.bench.engine_speed import prompt_text
from fishserve.cli import app
from fishserve.engine.engine import EngineEvent

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TINY = ["bench-engine-load", "--checkpoint", str(FIXTURES / "tiny_t2s"), "--device", "cpu"]
QUICK = LoadSettings(frames=10, context=20, duration=0.4, warmup=0.1, ramp=2, first_chunk=3)


def quick_engine(model, tokenizer, mode: str, streams: int):
    text = prompt_text(tokenizer, QUICK.context)
    prompt = prompt_positions(model, tokenizer, text)
    return load_engine(model, tokenizer, mode, streams, QUICK, prompt), text


def test_cli_reports_every_mode_and_stream_count(tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    args = [
        *TINY,
        "--streams",
        "2,5",
        "--modes",
        "sync,async",
        "--frames",
        "16",
        "--duration",
        "1",
        "--warmup",
        "0.1",
        "--first-chunk",
        "2",  # a short first chunk: reached in the window even on a slow, busy CPU
        "--output",
        str(out),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    payload = json.loads(out.read_text())
    points = payload["points"]
    assert [(p["streams"], p["mode"]) for p in points] == [
        (2, "sync"),
        (5, "sync"),
        (2, "async"),
        (5, "async"),
    ]
    for p in points:
        assert p["steps_per_s"] > 0 and p["frames_per_s"] > 0
        # one frame per stream and step at most; with async scheduling the window's frames
        # are those of its steps shifted by one step (launched before it, read in it)
        steps = round(p["steps_per_s"] * p["seconds"])
        assert p["frames_per_step"] * steps <= p["streams"] * (steps + 1)
        want = p["audio_frames_per_s"] / (p["streams"] * FRAMES_PER_SECOND)
        assert p["realtime_margin"] == pytest.approx(want)
        # each stream's first frame is not audio: fewer audio frames than frames
        assert 0 < p["audio_frames_per_s"] < p["frames_per_s"]
        assert p["streams_finished"] > 0  # 16-frame streams finish within the window
        assert p["first_frame_p50"] <= p["first_chunk_p50"]
    assert payload["settings"]["frames"] == 16 and payload["host_probe_ms"] > 0
    assert payload["prompt_positions"] > 0
    table = out.with_suffix(".md").read_text()
    assert "RT margin" in table and f"host probe: {payload['host_probe_ms']:.1f} ms" in table


def test_keeps_exactly_n_streams_in_flight(tiny_model, tiny_tokenizer) -> None:
    """Never more than N at once, N reached, and replaced as they finish; the engine is left
    empty."""
    engine, text = quick_engine(tiny_model, tiny_tokenizer, "sync", 6)
    seen: list[int] = []
    step = engine.step

    def counting_step():
        seen.append(len(engine.sequences))
        return step()

    engine.step = counting_step
    point = run_load_point(engine, 6, text, QUICK)
    assert max(seen) == 6
    assert seen[:3] == [2, 4, 6]  # the ramp: 2 new streams per step
    # every finished stream is replaced at the next step: within the window the two counts
    # differ only by the streams whose replacement straddles one of its ends (N at most)
    assert point.streams_finished > 0 and abs(point.streams_started - point.streams_finished) <= 6
    assert not engine.sequences


def test_frames_match_the_engines_count(tiny_model, tiny_tokenizer) -> None:
    engine, text = quick_engine(tiny_model, tiny_tokenizer, "async", 4)
    before = engine.frames_generated
    point = run_load_point(engine, 4, text, QUICK)
    measured = point.frames_per_s * point.seconds
    assert 0 < round(measured) <= engine.frames_generated - before
    assert point.frames_per_step == pytest.approx(measured / (point.steps_per_s * point.seconds))


def test_tracker_times_only_streams_submitted_in_the_window() -> None:
    codes = np.zeros(4, dtype=np.int64)
    tracker = _Tracker(first_chunk=2)
    tracker.add("a")  # before the window: its times are not recorded
    tracker.on_events([EngineEvent("a", codes)])
    tracker.start_window()
    tracker.add("b")
    tracker.on_events([EngineEvent("b", codes), EngineEvent("a", codes)])
    assert len(tracker.first_frame) == 1 and tracker.first_chunk_s == []
    tracker.on_events([EngineEvent("b", codes)])
    assert len(tracker.first_chunk_s) == 1
    assert tracker.first_frame[0] <= tracker.first_chunk_s[0]
    tracker.on_events([EngineEvent("b", None, finished=True)])
    tracker.on_events([EngineEvent("stale", None, finished=True)])  # an earlier point's
    assert tracker.finished == 1 and "b" not in tracker.submitted


def test_a_first_chunk_of_one_frame_is_the_first_frame() -> None:
    tracker = _Tracker(first_chunk=1)
    tracker.start_window()
    tracker.add("a")
    tracker.on_events([EngineEvent("a", np.zeros(4, dtype=np.int64))])
    assert tracker.first_frame == tracker.first_chunk_s and len(tracker.first_frame) == 1


def test_notes_name_points_without_a_first_chunk() -> None:
    nan = float("nan")
    point = LoadPoint(3, "sync", 1.0, 1.0, 3.0, 2.0, 3.0, 0.0, 0.05, 0, 0, nan, nan, nan, nan, 0)
    lines = notes([point], 7.31)
    assert lines[0].startswith("host probe: 7.3 ms")
    assert "3 sync" in lines[1] and "--duration" in lines[1]
    assert len(notes([LoadPoint(3, "sync", *[1.0] * 13, 0)], 1.0)) == 1
    late = notes([LoadPoint(3, "async", *[1.0] * 13, 2)], 1.0)
    assert len(late) == 2 and "3 async (2)" in late[1]


def test_no_streams_started_in_window_gives_nan() -> None:
    from fishserve.bench.engine_load import _percentiles

    assert all(math.isnan(v) for v in _percentiles([]))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (LoadSettings(duration=0), "duration"),
        (LoadSettings(frames=1), "frames"),
        (LoadSettings(ramp=0), "ramp"),
        (LoadSettings(boost_min_running=-1), "boost_min_running"),
        (LoadSettings(duration=math.inf), "finite"),
        (LoadSettings(warmup=math.inf), "finite"),
        (LoadSettings(frames=10, first_chunk=10), "9 audio frames"),
    ],
)
def test_bad_settings_are_refused(settings: LoadSettings, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        settings.check()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--modes", "eager"], "--modes"),
        (["--streams", "0"], "--streams"),
        (["--kv-cache-dtype", "int4"], "--kv-cache-dtype"),
        (["--frames", "240"], "the model's context of 256"),
        (["--context", "200", "--frames", "48"], "a prompt of"),  # longer than --context
        (["--modes", "async,async"], "distinct"),
        (["--streams", "4,4"], "distinct"),
        (["--duration", "inf"], "finite"),
        (["--frames", "8"], "first_chunk 10 exceeds"),
        (["--engine-sms", "56"], "--engine-sms needs a CUDA device"),
        (["--output", "x.wav"], "use one of .json"),
    ],
)
def test_bad_values_give_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, [*TINY, *args])
    assert result.exit_code == 2, result.output
    assert "error:" in result.output and message in result.output
    assert "Traceback" not in result.output


def test_async_mode_overlaps_steps_on_the_cpu_too(tiny_model, tiny_tokenizer) -> None:
    """The async point really launches steps ahead (the static step path), not sync steps
    under an async label."""
    engine, text = quick_engine(tiny_model, tiny_tokenizer, "async", 4)
    launched = []
    launch = engine.runner.launch
    engine.runner.launch = lambda *a, **k: launched.append(1) or launch(*a, **k)
    run_load_point(engine, 4, text, QUICK)
    assert len(launched) > 10


def test_timed_streams_get_their_first_chunk_after_the_window(tiny_model, tiny_tokenizer) -> None:
    """Streams submitted late in the window are timed after it too: none is left out."""
    engine, text = quick_engine(tiny_model, tiny_tokenizer, "sync", 4)
    settings = LoadSettings(frames=10, context=20, duration=0.3, warmup=0.0, first_chunk=9)
    point = run_load_point(engine, 4, text, settings)
    assert point.first_chunk_missing == 0
    assert point.streams_started > 0 and not math.isnan(point.first_chunk_p99)


def test_a_kv_cache_too_large_for_memory_is_a_clear_error(
    tiny_model, tiny_tokenizer, monkeypatch
) -> None:
    import fishserve.bench.engine_load as engine_load

    def no_memory(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate")

    monkeypatch.setattr(engine_load, "LLMEngine", no_memory)
    with pytest.raises(ValueError, match="lower --streams"):
        load_engine(tiny_model, tiny_tokenizer, "sync", 20_000, QUICK, 49)


def test_json_has_no_nan(tmp_path: Path, monkeypatch) -> None:
    """A point without a measurement is written as null (strict JSON readers refuse NaN)."""
    import fishserve.bench.engine_load as engine_load

    nan = float("nan")
    point = LoadPoint(2, "sync", 1.0, 1.0, 3.0, 2.0, 3.0, 0.0, 0.05, 0, 0, nan, nan, nan, nan, 0)
    monkeypatch.setattr(engine_load, "run_load_point", lambda *a: point)
    monkeypatch.setattr(engine_load, "load_engine", lambda *a: None)
    out = tmp_path / "load.json"
    args = [*TINY, "--streams", "2", "--frames", "16", "--output", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "NaN" not in text and json.loads(text)["points"][0]["first_chunk_p50"] is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_engine_on_an_sm_partition(tiny_tokenizer) -> None:
    """`engine_sms`: the steps run on the partition's stream, as the server's do."""
    from conftest import load_tiny_model

    from fishserve.engine.sm_partition import cuda_bindings_installed

    if not cuda_bindings_installed():
        pytest.skip("needs cuda-bindings")
    model = load_tiny_model().to("cuda")
    settings = LoadSettings(
        frames=10, context=20, duration=0.3, warmup=0.1, first_chunk=3, engine_sms=16
    )
    text = prompt_text(tiny_tokenizer, settings.context)
    prompt = prompt_positions(model, tiny_tokenizer, text)
    engine = load_engine(model, tiny_tokenizer, "async", 4, settings, prompt)
    assert engine.runner.stream is not None
    point = run_load_point(engine, 4, text, settings)
    assert point.frames_per_s > 0 and point.first_chunk_missing == 0


def test_profiler_records_a_window_of_the_loads_steps(tiny_model, tiny_tokenizer, tmp_path) -> None:
    """`FISHSERVE_TORCH_PROFILER_DIR`'s profiler sees the benchmark's steps, as the server's."""
    from fishserve.engine.step_profiler import StepProfiler

    engine, text = quick_engine(tiny_model, tiny_tokenizer, "sync", 3)
    profiler = StepProfiler(tmp_path, start_step=2, num_steps=3)
    run_load_point(engine, 3, text, QUICK, profiler)
    assert [p.suffix for p in profiler.written] == [".json", ".txt"]
    assert "engine steps 2..4" in (tmp_path / profiler.written[1].name).read_text()


def test_cli_refuses_bad_profiler_variables_before_loading(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("FISHSERVE_TORCH_PROFILER_DIR", str(tmp_path))
    monkeypatch.setenv("FISHSERVE_PROFILE_STEPS", "0")
    result = CliRunner().invoke(app, [*TINY, "--streams", "2"])
    assert result.exit_code == 2 and "FISHSERVE_PROFILE_STEPS" in result.output


def test_full_sort_share_counts_the_prefilters_misses(tiny_model, tiny_tokenizer) -> None:
    """The tiny random model's logits are flat: 8 candidates rarely hold the nucleus."""
    from dataclasses import replace

    shares = {}
    for k in (8, 0):
        s = replace(QUICK, top_k_prefilter=k)
        text = prompt_text(tiny_tokenizer, s.context)
        prompt = prompt_positions(tiny_model, tiny_tokenizer, text)
        engine = load_engine(tiny_model, tiny_tokenizer, "sync", 3, s, prompt)
        shares[k] = run_load_point(engine, 3, text, s).full_sort_share
    assert shares[8] > 0.5 and shares[0] == 0.0


def test_cli_says_which_point_the_profiled_steps_slowed(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("FISHSERVE_TORCH_PROFILER_DIR", str(tmp_path))
    monkeypatch.setenv("FISHSERVE_PROFILE_START_STEP", "2")
    monkeypatch.setenv("FISHSERVE_PROFILE_STEPS", "2")
    args = [*TINY, "--streams", "2", "--frames", "12", "--context", "20", "--duration", "0.3"]
    result = CliRunner().invoke(app, [*args, "--warmup", "0.1", "--first-chunk", "2"])
    assert result.exit_code == 0, result.output
    assert "steps 2..3 were profiled" in " ".join(result.output.split())
    assert list(tmp_path.glob("engine_steps_*.json"))
