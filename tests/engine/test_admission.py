"""Real-time admission (`engine.admission`, EngineConfig.min_stream_frame_rate): new requests
wait while running streams get too few frames per second; running ones are never held."""

from __future__ import annotations

import pytest

from fishserve.engine.admission import StreamRateGate
from fishserve.engine.engine import GenerationRequest
from fishserve.engine.sampling import SamplingParams
from tests.conftest import make_engine


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _steps(
    gate: StreamRateGate,
    clock: FakeClock,
    start: float,
    steps: int,
    running: int,
    frames_per_step: int,
    frames0: int,
    period: float = 0.1,
) -> int:
    """Record `steps` steps `period` s apart from `start`; returns the frame total."""
    frames = frames0
    for i in range(steps):
        clock.t = start + i * period
        gate.record(frames, running)
        frames += frames_per_step
    return frames - frames_per_step


def test_the_gate_admits_what_the_engines_frame_rate_serves_at_the_minimum():
    clock = FakeClock()
    gate = StreamRateGate(min_rate=20.0, window_s=1.0, clock=clock)
    assert gate.frame_rate() is None and gate.admits(0)  # nothing running: always
    assert not gate.admits(1) and gate.held == 1  # one running, nothing measured yet
    # 10 streams, a frame each every 0.1 s: 100 frames/s serve 5 streams at 20 frames/s
    frames = _steps(gate, clock, 0.0, 6, running=10, frames_per_step=10, frames0=0)
    assert gate.frame_rate() == pytest.approx(100.0)
    assert gate.stream_rate() == pytest.approx(10.0)
    assert gate.admits(4) and not gate.admits(5) and not gate.admits(9)
    assert gate.held == 2  # once per step
    # 30 frames per 0.1 s from the same 10 streams for over a window: 300 frames/s, 15 streams
    frames = _steps(gate, clock, 0.6, 15, running=10, frames_per_step=30, frames0=frames + 30)
    assert gate.frame_rate() == pytest.approx(300.0, rel=0.1)
    assert gate.stream_rate() == pytest.approx(30.0, rel=0.1)
    assert gate.admits(14) and not gate.admits(15) and gate.held == 3
    clock.t += 5.0  # an idle spell: the old steps say nothing about now
    assert gate.frame_rate() is None and gate.stream_rate() is None  # before any new step
    gate.record(frames, 0)  # the next step, with nothing running
    assert gate.frame_rate() is None and gate.capacity == 1


def test_steps_longer_than_the_window_are_still_measured():
    """One step every 0.6 s with a 0.5 s window: 10 streams at 1.67 frames/s each."""
    clock = FakeClock()
    gate = StreamRateGate(min_rate=0.5, window_s=0.5, clock=clock)
    _steps(gate, clock, 0.0, 4, running=10, frames_per_step=10, frames0=0, period=0.6)
    assert gate.stream_rate() == pytest.approx(10 / 6)
    assert gate.admits(10) and gate.capacity == 34  # ceil(16.7 / 0.5)


def test_the_gate_refuses_a_nonpositive_rate():
    with pytest.raises(ValueError, match="min_rate"):
        StreamRateGate(0.0)


def _request(i: int) -> GenerationRequest:
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=i)
    return GenerationRequest(
        "word " * 3, params=params, max_new_tokens=6, ignore_eos=True, request_id=f"r{i}"
    )


@pytest.mark.parametrize(("rate", "most"), [(0.0, 3), (1e9, 1)])
def test_a_slow_engine_runs_new_requests_one_at_a_time(tiny_model, tiny_tokenizer, rate, most):
    """With a rate no engine reaches, a new request waits while another runs (one with
    nothing running is always admitted); off, all three run together. All finish."""
    engine = make_engine(tiny_model, tiny_tokenizer, min_stream_frame_rate=rate)
    for i in range(3):
        engine.add_request(_request(i))
    peak, finished = 0, set()
    for _ in range(200):
        if not engine.has_work():
            break
        finished |= {e.request_id for e in engine.step() if e.finished}
        peak = max(peak, len(engine.scheduler.running))
    assert finished == {"r0", "r1", "r2"}
    assert peak == most
    stats = engine.stats()
    assert (stats.admission_held > 0) == (rate > 0)
    assert stats.admission_held <= stats.steps  # counted once per step


def test_requests_that_ran_before_are_not_held(tiny_model, tiny_tokenizer):
    """A preempted (or between-segments) sequence goes back in even when new ones are held."""
    engine = make_engine(tiny_model, tiny_tokenizer)
    scheduler = engine.scheduler
    scheduler.admission = lambda running: running == 0  # hold new ones while any run
    first, fresh, again = (engine.prepare(_request(i)) for i in range(3))
    for seq in (first, fresh):
        engine.enqueue(seq)
    scheduler.schedule()
    assert scheduler.running == [first] and list(scheduler.waiting) == [fresh]
    engine.enqueue(again)
    again.first_scheduled_time = 0.0  # as if it had run and been preempted
    scheduler.requeue(again)
    scheduler.schedule()
    assert scheduler.running == [first, again] and list(scheduler.waiting) == [fresh]
