"""The threaded engine API: submit, stream, cancel, back-pressure."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
import torch
from conftest import make_engine, run_engine
from test_engine import sampled_requests

from fishserve.engine.async_engine import AsyncEngine, EngineBusyError, EngineDeadError
from fishserve.engine.engine import GenerationRequest


@pytest.fixture
def async_engine(tiny_model, tiny_tokenizer):
    engine = AsyncEngine(make_engine(tiny_model, tiny_tokenizer), max_waiting=64)
    engine.start()
    yield engine
    engine.shutdown()


def collect(stream) -> tuple[torch.Tensor, str]:
    codes, reason = [], None
    for event in stream:
        if event.codes is not None:
            codes.append(event.codes)
        if event.finished:
            reason = event.finish_reason
    return torch.from_numpy(np.stack(codes, 1)), reason


def test_threads_get_the_same_codes_as_the_sync_engine(async_engine, tiny_model, tiny_tokenizer):
    expected = run_engine(make_engine(tiny_model, tiny_tokenizer), sampled_requests())
    results = {}

    def client(request: GenerationRequest) -> None:
        results[request.request_id] = collect(async_engine.submit(request))

    threads = [threading.Thread(target=client, args=(r,)) for r in sampled_requests()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for rid, (codes, final) in expected.items():
        assert results[rid][1] == final.finish_reason
        assert torch.equal(results[rid][0], codes)


def test_asyncio_stream_and_cancel(async_engine):
    async def main() -> tuple[int, str]:
        loop = asyncio.get_running_loop()
        request = GenerationRequest(
            "Cancel me soon please.", max_new_tokens=200, ignore_eos=True, request_id="c"
        )
        stream = async_engine.submit(request, loop)
        frames = 0
        async for event in stream:
            if event.codes is not None:
                frames += 1
                if frames == 3:
                    async_engine.cancel("c")
            if event.finished:
                return frames, event.finish_reason
        raise AssertionError("stream ended without a final event")

    frames, reason = asyncio.run(main())
    assert reason == "cancelled" and frames < 200
    for _ in range(100):  # the engine thread frees blocks before its next step
        stats = async_engine.stats()
        if stats.running == 0 and stats.blocks_free == stats.blocks_total:
            break
        threading.Event().wait(0.02)
    assert stats.blocks_free == stats.blocks_total


def test_a_burst_held_by_real_time_admission_counts_against_the_queue(tiny_model, tiny_tokenizer):
    """With admission letting one stream run, 16 requests at once into 16 free sequence
    slots: 1 runs, `max_waiting` (2) wait, the rest are refused, not queued past the bound."""
    engine = AsyncEngine(
        make_engine(tiny_model, tiny_tokenizer, max_num_seqs=16, min_stream_frame_rate=1e9),
        max_waiting=2,
    )
    engine.start()
    accepted, refused = [], 0
    try:
        for i in range(16):
            try:
                accepted.append(
                    engine.submit(
                        GenerationRequest("Burst.", request_id=f"q{i}", max_new_tokens=50)
                    )
                )
            except EngineBusyError:
                refused += 1
        assert (len(accepted), refused) == (3, 13)
        for s in accepted:
            engine.cancel(s.request_id)
    finally:
        engine.shutdown()


def test_full_queue_says_busy(tiny_model, tiny_tokenizer):
    engine = AsyncEngine(make_engine(tiny_model, tiny_tokenizer, max_num_seqs=1), max_waiting=2)
    engine.start()
    try:
        long = dict(max_new_tokens=500, ignore_eos=True)
        streams = [
            engine.submit(GenerationRequest("Busy one.", request_id=f"b{i}", **long))
            for i in range(2)
        ]
        assert engine.pending() == 1  # the second waits, whether or not a step has run yet
        with pytest.raises(EngineBusyError):
            for i in range(2, 6):
                streams.append(
                    engine.submit(GenerationRequest("More.", request_id=f"b{i}", **long))
                )
        for s in streams:
            engine.cancel(s.request_id)
    finally:
        engine.shutdown()
    with pytest.raises(EngineDeadError):
        engine.submit(GenerationRequest("After shutdown."))


def test_invalid_request_raises_in_the_caller(async_engine):
    with pytest.raises(ValueError, match="empty"):
        async_engine.submit(GenerationRequest("  "))


def test_a_step_wakes_each_event_loop_once(async_engine):
    """Events of many asyncio streams in one step cost one cross-thread callback."""
    from fishserve.engine.async_engine import RequestStream
    from fishserve.engine.engine import EngineEvent

    loop = asyncio.new_event_loop()
    calls = []
    real = loop.call_soon_threadsafe
    loop.call_soon_threadsafe = lambda *args: calls.append(args) or real(*args)  # type: ignore[method-assign]
    streams = [RequestStream(f"s{i}", loop) for i in range(5)]
    with async_engine._lock:
        async_engine._streams.update({s.request_id: s for s in streams})
    frame = np.zeros(9, dtype=np.int64)
    events = [EngineEvent(s.request_id, codes=frame) for s in streams]
    async_engine._dispatch([*events, EngineEvent("s0", finished=True, finish_reason="stop")])
    assert len(calls) == 1

    async def first_two(stream: RequestStream) -> list[EngineEvent]:
        got = []
        async for event in stream:
            got.append(event)
            if len(got) == 2 or stream.request_id != "s0":
                return got
        return got

    async def all_streams() -> list[list[EngineEvent]]:
        return await asyncio.gather(*(first_two(s) for s in streams))

    got = loop.run_until_complete(all_streams())
    loop.close()
    assert [len(g) for g in got] == [2, 1, 1, 1, 1]
    assert got[0][1].finished and "s0" not in async_engine._streams


def test_next_batch_wakes_once_enough_events_or_the_last_one_arrived():
    from fishserve.engine.async_engine import RequestStream
    from fishserve.engine.engine import EngineEvent

    def frame(i: int) -> EngineEvent:
        return EngineEvent("r", codes=np.full((2,), i, dtype=np.int64))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stream = RequestStream("r", loop)
        assert stream.ready() == []
        stream.put_in_loop(frame(0))
        task = asyncio.ensure_future(stream.next_batch(3))
        stream.put(frame(1))  # through the loop, as the engine thread delivers
        await asyncio.sleep(0.01)
        assert not task.done()  # two of three
        stream.put(frame(2))
        batch = await asyncio.wait_for(task, 1)
        assert [int(e.codes[0]) for e in batch] == [0, 1, 2]
        stream.put_in_loop(frame(3))
        stream.put_in_loop(EngineEvent("r", finished=True, finish_reason="stop"))
        last = await asyncio.wait_for(stream.next_batch(10), 1)  # the final event ends the wait
        assert int(last[0].codes[0]) == 3 and last[-1].finished
        assert stream.ready() == []

    asyncio.run(main())
    with pytest.raises(RuntimeError):
        RequestStream("s", None).ready()


def test_a_sink_gets_each_step_s_events_in_one_call(async_engine, tiny_model, tiny_tokenizer):
    """Requests submitted with a sink (the core's relay) get their events as one list per
    step, in order, the same codes as a blocking stream, and nothing through a stream."""
    calls: list[list] = []
    done = threading.Event()

    def sink(events) -> None:
        calls.append(list(events))
        if sum(e.finished for batch in calls for e in batch) == 2:
            done.set()

    from fishserve.engine.sampling import SamplingParams

    long = dict(max_new_tokens=6, ignore_eos=True, params=SamplingParams(seed=5))
    for rid in ("a", "b"):
        async_engine.submit(GenerationRequest("Sink me.", request_id=rid, **long), sink=sink)
    assert done.wait(60)
    by_request = {rid: [e for batch in calls for e in batch if e.request_id == rid] for rid in "ab"}
    for events in by_request.values():
        assert [e.codes is not None for e in events] == [True] * 5 + [False]  # 1st: no audio
        assert events[-1].finished and events[-1].finish_reason == "length"
    assert any(len({e.request_id for e in batch}) == 2 for batch in calls)  # one call, both
    alone = collect(async_engine.submit(GenerationRequest("Sink me.", request_id="c", **long)))[0]
    assert np.array_equal(np.stack([e.codes for e in by_request["a"][:-1]], 1), alone.numpy())


def test_a_failed_stream_raises_after_its_buffered_events():
    from fishserve.engine.async_engine import RequestStream
    from fishserve.engine.engine import EngineEvent

    async def main() -> None:
        stream = RequestStream("r", asyncio.get_running_loop())
        waiting = asyncio.ensure_future(stream.next_batch(5))
        await asyncio.sleep(0)
        stream.put_in_loop(EngineEvent("r", codes=np.zeros(2, np.int64)))
        stream.fail(EngineBusyError("busy"))
        stream.fail(EngineDeadError("later errors do not replace the first"))
        got = await asyncio.wait_for(waiting, 1)  # the buffered frame first
        assert len(got) == 1 and got[0].codes is not None
        with pytest.raises(EngineBusyError, match="busy"):
            await asyncio.wait_for(stream.next_batch(1), 1)

    asyncio.run(main())
