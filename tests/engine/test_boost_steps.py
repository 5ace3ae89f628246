"""Boost steps (EngineConfig.boost_frames): young streams get a step of their own after each
full step, without changing any stream's frames, with sync or asynchronous scheduling."""

from __future__ import annotations

import pytest
import torch

from fishserve.engine.engine import EngineConfig, GenerationRequest
from fishserve.engine.sampling import SamplingParams
from tests.conftest import load_tiny_model, make_engine, run_engine


def _request(i: int, frames: int = 12, chunk_length: int = 0) -> GenerationRequest:
    params = SamplingParams(temperature=1.0, top_p=0.95, repetition_penalty=1.2, seed=i)
    return GenerationRequest(
        "word " * (3 + i),
        params=params,
        max_new_tokens=frames,
        ignore_eos=True,
        chunk_length=chunk_length,
        request_id=f"r{i}",
    )


def _stream(engine, arrivals: dict[int, list[GenerationRequest]]) -> dict[str, list]:
    """Step `engine` to idle, adding arrivals[k] before step k; codes per request."""
    codes: dict[str, list] = {}
    step = 0
    while engine.has_work() or step <= max(arrivals):
        for request in arrivals.get(step, []):
            engine.add_request(request)
            codes[request.request_id] = []
        for event in engine.step():
            if event.codes is not None:
                codes[event.request_id].append(event.codes.tolist())
        step += 1
        assert step < 2000, "engine did not finish"
    return codes


def _arrivals() -> dict[int, list[GenerationRequest]]:
    """Three streams from the start, then one every few steps (some long texts)."""
    late = {4: [_request(3)], 9: [_request(4, chunk_length=12)], 15: [_request(5, 20)]}
    return {0: [_request(i, 14 + 3 * i, chunk_length=12 * (i % 2)) for i in range(3)], **late}


SETTINGS = {
    "static rows": {"static_decode": True},
    "general path": {"static_decode": False},
    "preemption": {"static_decode": True, "num_kv_blocks": 14},
    "async": {"static_decode": True, "async_scheduling": True},
    "async, preemption": {"static_decode": True, "async_scheduling": True, "num_kv_blocks": 14},
}


@pytest.mark.parametrize("settings", SETTINGS.values(), ids=SETTINGS.keys())
def test_boost_steps_give_the_frames_of_plain_steps(tiny_model, tiny_tokenizer, settings):
    base = {"max_num_seqs": 8, **settings}
    plain_settings = {k: v for k, v in base.items() if k != "async_scheduling"}
    plain = _stream(make_engine(tiny_model, tiny_tokenizer, **plain_settings), _arrivals())
    engine = make_engine(tiny_model, tiny_tokenizer, boost_frames=4, boost_min_running=1, **base)
    boosted = _stream(engine, _arrivals())
    assert boosted == plain
    assert engine.boost_steps > 0 and engine.stats().boost_steps == engine.boost_steps
    assert engine.blocks.num_free == engine.blocks.num_blocks
    assert not engine.has_work()
    if "num_kv_blocks" in settings:
        assert engine.scheduler.num_preemptions > 0


def test_cancelling_in_a_boost_step_frees_the_blocks(tiny_model, tiny_tokenizer):
    engine = make_engine(tiny_model, tiny_tokenizer, boost_frames=6, boost_min_running=1)
    engine.add_request(_request(0, 40))
    for _ in range(8):
        engine.step()
    engine.add_request(_request(1, 40))
    engine.step()  # a boost step admits r1
    assert engine.boost_steps == 1 and len(engine.sequences["r1"].frames) == 1
    assert engine.abort("r1").finish_reason == "cancelled"
    for _ in range(3):
        engine.step()  # r0 alone again: no boost step
    assert engine.boost_steps == 1
    assert engine.abort("r0").finish_reason == "cancelled"
    assert engine.blocks.num_free == engine.blocks.num_blocks and not engine.has_work()


def test_a_boost_step_runs_only_the_young_sequences(tiny_model, tiny_tokenizer):
    engine = make_engine(tiny_model, tiny_tokenizer, boost_frames=2, boost_min_running=1)
    engine.add_request(_request(0, 30))
    old = engine.sequences["r0"]
    while len(old.frames) <= 2:  # 3 frames: the prompt's and 2 of audio, so no longer young
        engine.step()
    assert engine.boost_steps == 0  # nothing young beside it yet
    engine.add_request(_request(1, 30))
    young = engine.sequences["r1"]
    engine.step()  # a boost step admits the waiting request (its prompt gives frame 0)
    assert (len(old.frames), len(young.frames)) == (3, 1) and engine.boost_steps == 1
    engine.step()  # a full step
    assert (len(old.frames), len(young.frames)) == (4, 2)
    engine.step()  # a boost step: the young one alone (1 audio frame)
    assert (len(old.frames), len(young.frames)) == (4, 3) and engine.boost_steps == 2
    engine.step()  # full: the young one reaches 3 audio frames, more than boost_frames
    assert (len(old.frames), len(young.frames)) == (5, 4)
    engine.step()  # so no boost step follows
    assert (len(old.frames), len(young.frames)) == (6, 5) and engine.boost_steps == 2


def test_no_boost_steps_below_the_running_minimum(tiny_model, tiny_tokenizer):
    engine = make_engine(tiny_model, tiny_tokenizer, boost_frames=8, boost_min_running=3)
    codes = run_engine(engine, [_request(i, 10) for i in range(3)])
    assert engine.boost_steps == 0  # at most two others beside any young sequence
    plain = run_engine(make_engine(tiny_model, tiny_tokenizer), [_request(i, 10) for i in range(3)])
    assert all(torch.equal(codes[k][0], plain[k][0]) for k in plain)


def test_an_old_streams_next_segment_gets_no_boost_step(tiny_model, tiny_tokenizer):
    engine = make_engine(tiny_model, tiny_tokenizer, boost_frames=2, boost_min_running=1)
    long_text = GenerationRequest(
        "word " * 10, max_new_tokens=8, ignore_eos=True, chunk_length=12, request_id="long"
    )
    engine.add_request(long_text)
    engine.add_request(_request(1, 200))
    seq, segments = engine.sequences["long"], set()
    while "long" in engine.sequences:
        engine.step()
        segments.add(seq.segment)
    assert len(segments) > 2  # it went back to the waiting queue for each next segment
    assert engine.boost_steps == 0  # both started together: nobody was young beside others


def test_a_stream_alone_gets_no_boost_steps(tiny_model, tiny_tokenizer):
    engine = make_engine(tiny_model, tiny_tokenizer, boost_frames=8, boost_min_running=0)
    run_engine(engine, [_request(0, 10)])
    assert engine.boost_steps == 0  # a boost step would only repeat the full step


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"boost_frames": -1}, "must be >= 0"),
        ({"boost_min_running": -1}, "must be >= 0"),
    ],
)
def test_bad_boost_settings_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**settings)


def _static_engine(model, tokenizer, **settings):
    """A boosting engine (boost_min_running 1) on the static-rows path."""
    return make_engine(model, tokenizer, boost_min_running=1, static_decode=True, **settings)


def test_an_async_boost_step_runs_only_the_young_sequences(tiny_model, tiny_tokenizer):
    engine = _static_engine(tiny_model, tiny_tokenizer, boost_frames=3, async_scheduling=True)
    engine.add_request(_request(0, 40))
    for _ in range(8):
        engine.step()
    engine.add_request(_request(1, 40))
    old, young = engine.sequences["r0"], engine.sequences["r1"]
    seen = []
    for _ in range(8):  # every step's events are the step before's (asynchronous)
        seen.append({e.request_id for e in engine.step() if e.codes is not None})
    assert engine.boost_steps > 0
    assert {"r1"} in seen  # the frames of a boost step: the young stream's alone
    assert len(young.frames) > len(old.frames) - 8  # it made up ground on the old one


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_boost_steps_end_at_boost_frames_with_a_frame_in_flight(
    tiny_model, tiny_tokenizer, async_scheduling
):
    """A young stream's frame in flight counts (asynchronous scheduling): no boost step samples
    its audio frame boost_frames + 1, whichever steps (boost or full) it was admitted in."""
    engine = _static_engine(
        tiny_model, tiny_tokenizer, boost_frames=4, async_scheduling=async_scheduling
    )
    engine.add_request(_request(0, 60))
    for _ in range(12):
        engine.step()
    engine.add_request(_request(2, 60))
    engine.step()  # a boost step admits r2
    engine.add_request(_request(1, 60))  # the full step after it admits r1
    boosted: list[int] = []  # indices of r1's frames that boost steps sample
    schedule = engine._schedule

    def spy():
        batch = schedule()
        if engine._boosted:
            boosted.extend(seq.num_frames for seq, _ in batch.items if seq.request_id == "r1")
        return batch

    engine._schedule = spy
    while engine.has_work():
        engine.step()
    assert boosted == [1, 3]  # audio frames 1 and 3 (frame 0 is not audio); 5 is too many


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_cuda_graph_boost_steps_give_the_frames_of_plain_steps(tiny_tokenizer, async_scheduling):
    model = load_tiny_model().cuda()
    base = {"max_num_seqs": 8, "num_kv_blocks": 64}
    plain = _stream(make_engine(model, tiny_tokenizer, **base), _arrivals())
    engine = make_engine(
        model,
        tiny_tokenizer,
        boost_frames=4,
        boost_min_running=1,
        async_scheduling=async_scheduling,
        **base,
    )
    assert engine.runner.num_captures > 0
    assert _stream(engine, _arrivals()) == plain
    assert engine.boost_steps > 0
