"""`fishserve bench-engine-load`: the engine alone with N streams kept in flight."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from fishserve.bench.engine_load import (
    FRAMES_PER_SECOND,
    LoadSettings,
    _Tracker,
    load_engine,
    run_load_point,
)
from fishserve.bench.engine_speed import prompt_text
from fishserve.cli import app
from fishserve.engine.engine import EngineEvent

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TINY = ["bench-engine-load", "--checkpoint", str(FIXTURES / "tiny_t2s"), "--device", "cpu"]
QUICK = LoadSettings(frames=10, context=20, duration=0.4, warmup=0.1, ramp=2, first_chunk=3)


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
        assert p["frames_per_step"] <= p["streams"]  # one frame per stream and step at most
        want = p["frames_per_s"] / (p["streams"] * FRAMES_PER_SECOND)
        assert p["realtime_margin"] == pytest.approx(want)
        assert p["streams_finished"] > 0  # 16-frame streams finish within the window
        assert p["first_frame_p50"] <= p["first_chunk_p50"]
    assert payload["settings"]["frames"] == 16 and payload["host_probe_ms"] > 0
    table = out.with_suffix(".md").read_text()
    assert "RT margin" in table and f"host probe: {payload['host_probe_ms']:.1f} ms" in table


def test_keeps_exactly_n_streams_in_flight(tiny_model, tiny_tokenizer) -> None:
    """Never more than N at once, N reached, and replaced as they finish; the engine is left
    empty."""
    engine = load_engine(tiny_model, tiny_tokenizer, "sync", 6, QUICK)
    seen: list[int] = []
    step = engine.step

    def counting_step():
        seen.append(len(engine.sequences))
        return step()

    engine.step = counting_step
    point = run_load_point(engine, 6, prompt_text(tiny_tokenizer, QUICK.context), QUICK)
    assert max(seen) == 6
    assert seen[:3] == [2, 4, 6]  # the ramp: 2 new streams per step
    # every finished stream is replaced at the next step: within the window the two counts
    # differ only by the streams whose replacement straddles one of its ends (N at most)
    assert point.streams_finished > 0 and abs(point.streams_started - point.streams_finished) <= 6
    assert not engine.sequences


def test_frames_match_the_engines_count(tiny_model, tiny_tokenizer) -> None:
    engine = load_engine(tiny_model, tiny_tokenizer, "async", 4, QUICK)
    text = prompt_text(tiny_tokenizer, QUICK.context)
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
    from fishserve.bench.engine_load import LoadPoint, notes

    nan = float("nan")
    point = LoadPoint(3, "sync", 1.0, 1.0, 3.0, 3.0, 0.0, 0.05, 0, 0, nan, nan, nan, nan)
    lines = notes([point], 7.31)
    assert lines[0].startswith("host probe: 7.3 ms")
    assert "3 sync" in lines[1] and "--duration" in lines[1]
    assert len(notes([LoadPoint(3, "sync", *[1.0] * 12)], 1.0)) == 1


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
        (["--output", "x.wav"], "use one of .json"),
    ],
)
def test_bad_values_give_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, [*TINY, *args])
    assert result.exit_code == 2, result.output
    assert "error:" in result.output and message in result.output
    assert "Traceback" not in result.output
