"""Asynchronous scheduling: step N+1 launched before step N's frames reach the host.

The frames must be exactly those of synchronous stepping, whatever happens while a frame is in
flight: a stop, a new segment of a long text, a preemption, a cancellation, a step too large
for the static rows.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fishserve.engine.decode_step import FrameCarry, carry_plan
from fishserve.engine.engine import GenerationRequest
from fishserve.engine.sampling import SamplingParams
from tests.conftest import load_tiny_model, make_engine, run_engine


def _requests(n: int = 8) -> list[GenerationRequest]:
    """Mixed requests: most stop on their own, odd ones are long texts in segments."""
    return [
        GenerationRequest(
            text="word " * (3 + i),
            params=SamplingParams(temperature=1.0, top_p=0.95, repetition_penalty=1.2, seed=i),
            max_new_tokens=30 if i % 3 else 7,
            chunk_length=[0, 12][i % 2],
            request_id=f"r{i}",
        )
        for i in range(n)
    ]


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for rid in a:
        (codes_a, final_a), (codes_b, final_b) = a[rid], b[rid]
        assert torch.equal(codes_a, codes_b), rid
        assert final_a.finish_reason == final_b.finish_reason, rid


SETTINGS = {
    "plain": {},
    # sync: prompts past the static rows run on the general path; async: chunked into the rows
    "prompts past the static rows": {"static_prefill_tokens": 4, "max_num_batched_tokens": 64},
    "preemption": {"num_kv_blocks": 14},
}


@pytest.mark.parametrize("settings", SETTINGS.values(), ids=SETTINGS.keys())
def test_async_steps_give_the_frames_of_sync_steps(tiny_model, tiny_tokenizer, settings):
    base = {"static_decode": True, "max_num_seqs": 4, **settings}
    sync = run_engine(make_engine(tiny_model, tiny_tokenizer, **base), _requests())
    engine = make_engine(tiny_model, tiny_tokenizer, async_scheduling=True, **base)
    overlapped = run_engine(engine, _requests())
    _same(sync, overlapped)
    reasons = {final.finish_reason for _, final in sync.values()}
    assert "stop" in reasons and "length" in reasons  # stops happened with frames in flight
    assert engine.blocks.num_free == engine.blocks.num_blocks  # every block came back
    assert all(seq.inflight == 0 for seq in engine.sequences.values())
    if "num_kv_blocks" in settings:
        assert engine.scheduler.num_preemptions > 0


def test_async_steps_stay_inside_the_static_rows(tiny_model, tiny_tokenizer, monkeypatch):
    """Prompts longer than the rows left are prefilled in chunks: no step drains the pipeline
    for a synchronous step with an eager prefill (`ModelRunner.execute`)."""
    base = {"static_decode": True, "max_num_seqs": 4, "static_prefill_tokens": 4}
    engine = make_engine(
        tiny_model, tiny_tokenizer, async_scheduling=True, max_num_batched_tokens=64, **base
    )
    assert engine.scheduler.config.max_num_batched_tokens == engine.runner.max_rows == 8
    sizes: list[int] = []
    launch = engine.runner.launch
    monkeypatch.setattr(engine.runner, "execute", lambda batch: pytest.fail("a sync step ran"))
    monkeypatch.setattr(
        engine.runner, "launch", lambda b, c: sizes.append(b.num_tokens) or launch(b, c)
    )
    run_engine(engine, _requests())
    assert max(sizes) <= 8 and len(sizes) > 0
    sync = make_engine(tiny_model, tiny_tokenizer, max_num_batched_tokens=64, **base)
    assert sync.scheduler.config.max_num_batched_tokens == 64  # sync steps are not capped


def test_capped_steps_leave_no_general_path_to_warm_up(tiny_model, tiny_tokenizer):
    from fishserve.engine.warmup import general_path_reachable

    base = {"static_decode": True, "max_num_seqs": 4, "max_num_batched_tokens": 512}
    capped = make_engine(tiny_model, tiny_tokenizer, async_scheduling=True, **base)
    assert not general_path_reachable(capped)
    assert general_path_reachable(make_engine(tiny_model, tiny_tokenizer, **base))


def test_no_static_prefill_rows_no_cap(tiny_model, tiny_tokenizer):
    """static_prefill_tokens 0: prompts would get only the rows decoding leaves free."""
    engine = make_engine(
        tiny_model,
        tiny_tokenizer,
        async_scheduling=True,
        static_decode=True,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        static_prefill_tokens=0,
    )
    assert engine.scheduler.config.max_num_batched_tokens == 64


def test_a_step_returns_the_previous_steps_frames(tiny_model, tiny_tokenizer):
    engine = make_engine(tiny_model, tiny_tokenizer, static_decode=True, async_scheduling=True)
    engine.add_request(GenerationRequest("hello there", max_new_tokens=5, ignore_eos=True))
    seq = next(iter(engine.sequences.values()))
    prompt = seq.prompt_np.shape[1]
    assert engine.step() == []  # the prompt's step is launched; nothing is read yet
    assert seq.num_computed == prompt and not seq.frames and engine.has_work()
    # The prompt's frame is read (it opens the segment: no audio event) after the next step,
    # which computes that frame's position, was launched with it taken on the device.
    assert engine.step() == []
    assert len(seq.frames) == 1 and seq.num_computed == prompt + 1
    events = engine.step()
    assert [e.codes is not None for e in events] == [True]
    assert len(seq.frames) == 2 and seq.num_computed == prompt + 2


def test_cancelling_with_a_frame_in_flight_drops_it(tiny_model, tiny_tokenizer):
    def requests() -> list[GenerationRequest]:
        params = SamplingParams(seed=3)
        return [
            GenerationRequest("one two three", params=params, max_new_tokens=20, request_id=rid)
            for rid in ("keep", "cancel")
        ]

    alone = run_engine(make_engine(tiny_model, tiny_tokenizer, static_decode=True), requests()[:1])
    engine = make_engine(tiny_model, tiny_tokenizer, static_decode=True, async_scheduling=True)
    for request in requests():
        engine.add_request(request)
    frames: dict[str, list] = {"keep": [], "cancel": []}
    for _ in range(6):
        for event in engine.step():
            if event.codes is not None:
                frames[event.request_id].append(event.codes)
    cancelled = engine.sequences["cancel"]
    assert cancelled.num_computed == cancelled.num_positions  # its next step is launched
    assert engine.abort("cancel").finish_reason == "cancelled"
    after = len(frames["cancel"])
    while engine.has_work():
        for event in engine.step():
            assert event.request_id == "keep"
            if event.codes is not None:
                frames["keep"].append(event.codes)
    assert len(frames["cancel"]) == after
    assert torch.equal(torch.from_numpy(np.stack(frames["keep"], 1)), alone["keep"][0])
    assert engine.blocks.num_free == engine.blocks.num_blocks


def test_no_position_is_scheduled_past_the_budget(tiny_model, tiny_tokenizer):
    engine = make_engine(tiny_model, tiny_tokenizer, static_decode=True, async_scheduling=True)
    engine.add_request(GenerationRequest("hi", max_new_tokens=3, ignore_eos=True))
    seq = next(iter(engine.sequences.values()))
    positions = []
    while engine.has_work():
        engine.step()
        if seq.status.value == "running":
            positions.append(seq.num_computed)
    assert max(positions) <= seq.prompt_np.shape[1] + seq.budget - 1
    assert seq.num_pending == 0 or not engine.sequences


def test_a_missing_frame_in_flight_is_an_error(tiny_model, tiny_tokenizer):
    engine = make_engine(tiny_model, tiny_tokenizer, static_decode=True)
    engine.add_request(GenerationRequest("hello", max_new_tokens=4, ignore_eos=True))
    engine.step()
    engine.step()
    seq = next(iter(engine.sequences.values()))
    seq.frames.pop()  # as an asynchronous step sees it: the last frame not read yet
    seq.inflight = 1
    assert seq.column_in_flight and seq.inflight_window_slot == 0
    with pytest.raises(RuntimeError, match="in flight"):
        carry_plan([seq], None)
    with pytest.raises(RuntimeError, match="in flight"):
        carry_plan([seq], FrameCarry(torch.zeros(1, 5, dtype=torch.long), {}))
    assert (
        carry_plan([seq], FrameCarry(torch.zeros(1, 5, dtype=torch.long), {id(seq): 0})).shape[1]
        == 1
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_async_cuda_graph_steps_give_the_frames_of_sync_steps(tiny_tokenizer):
    model = load_tiny_model().cuda()
    base = {"max_num_seqs": 4, "num_kv_blocks": 64}
    sync = run_engine(make_engine(model, tiny_tokenizer, **base), _requests())
    engine = make_engine(model, tiny_tokenizer, async_scheduling=True, **base)
    assert engine.runner.num_captures > 0
    _same(sync, run_engine(engine, _requests()))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_async_steps_run_at_the_decoders_stream_priority(tiny_tokenizer):
    model = load_tiny_model().cuda()
    base = {"max_num_seqs": 2, "num_kv_blocks": 16, "enforce_eager": True}
    overlapped = make_engine(model, tiny_tokenizer, async_scheduling=True, **base)
    assert overlapped.runner.stream.priority == 0  # the decoder's (the default stream's)
    assert make_engine(model, tiny_tokenizer, **base).runner.stream.priority < 0
