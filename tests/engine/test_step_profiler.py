"""The environment-driven engine step profiler (fishserve.engine.step_profiler)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_engine
from test_engine import sampled_requests

from fishserve.engine.async_engine import AsyncEngine
from fishserve.engine.step_profiler import ENV_DIR, ENV_START, ENV_STEPS, MAX_STEPS, StepProfiler


def test_disabled_unless_the_directory_is_set(monkeypatch) -> None:
    monkeypatch.delenv(ENV_DIR, raising=False)
    profiler = StepProfiler.from_env()
    assert not profiler.enabled
    profiler.before_step()
    profiler.after_step()
    assert profiler.written == []


@pytest.mark.parametrize(("name", "value"), [(ENV_START, "-1"), (ENV_STEPS, "0"), (ENV_STEPS, "x")])
def test_bad_step_counts_are_refused(monkeypatch, tmp_path, name: str, value: str) -> None:
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name):
        StepProfiler.from_env()


def test_records_the_window_of_a_running_engine(monkeypatch, tmp_path, tiny_model, tiny_tokenizer):
    out = tmp_path / "prof"
    monkeypatch.setenv(ENV_DIR, str(out))
    monkeypatch.setenv(ENV_START, "2")
    monkeypatch.setenv(ENV_STEPS, "3")
    engine = AsyncEngine(make_engine(tiny_model, tiny_tokenizer), max_waiting=8)
    engine.start()
    try:
        streams = [engine.submit(request) for request in sampled_requests(2)]
        for stream in streams:
            assert list(stream)[-1].finished
    finally:
        engine.shutdown(timeout=120)  # writing the trace takes seconds; more on a busy CPU
    trace, table = engine.profiler.written
    assert trace == out / trace.name and trace.suffix == ".json" and trace.stat().st_size > 0
    text = Path(table).read_text()
    assert text.startswith("engine steps 2..4:") and "aten::" in text
    assert not engine.profiler.enabled  # one window per process


def test_unusable_directory_is_refused_at_start(monkeypatch, tmp_path) -> None:
    blocker = tmp_path / "afile"
    blocker.write_text("")
    monkeypatch.setenv(ENV_DIR, str(blocker / "sub"))
    with pytest.raises(ValueError, match="cannot create"):
        StepProfiler.from_env()


def test_step_counts_are_not_checked_while_disabled(monkeypatch) -> None:
    monkeypatch.delenv(ENV_DIR, raising=False)
    monkeypatch.setenv(ENV_STEPS, "0")
    assert not StepProfiler.from_env().enabled


def test_an_open_window_is_written_when_the_engine_stops(
    monkeypatch, tmp_path, tiny_model, tiny_tokenizer
):
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    monkeypatch.setenv(ENV_START, "1")
    monkeypatch.setenv(ENV_STEPS, str(MAX_STEPS))
    engine = AsyncEngine(make_engine(tiny_model, tiny_tokenizer), max_waiting=8)
    engine.start()
    try:
        for stream in [engine.submit(request) for request in sampled_requests(2)]:
            assert list(stream)[-1].finished
    finally:
        engine.shutdown(timeout=120)  # writing the trace takes seconds; more on a busy CPU
    trace, table = engine.profiler.written
    assert trace.is_file() and Path(table).read_text().startswith("engine steps 1..")


def test_other_threads_are_recorded(monkeypatch, tmp_path) -> None:
    """The decoder runs on its own thread in the server: its ops must be in the table."""
    import threading

    import torch

    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    monkeypatch.setenv(ENV_START, "0")
    monkeypatch.setenv(ENV_STEPS, "3")
    profiler = StepProfiler.from_env()
    for _ in range(3):
        profiler.before_step()
        worker = threading.Thread(target=lambda: torch.fft.rfft(torch.ones(64)))
        worker.start()
        torch.mm(torch.ones(8, 8), torch.ones(8, 8))
        worker.join()
        profiler.after_step()
    text = profiler.written[1].read_text()
    assert "aten::mm" in text and "aten::fft_rfft" in text
