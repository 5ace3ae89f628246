"""The per-request pipeline (pipeline.py): its playback clock and early wake-up, its deadlines,
and the finish reason on its last chunk."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from fishserve.audio.batching import DecodeJob
from fishserve.audio.streaming import ChunkPolicy
from fishserve.engine.async_engine import RequestStream
from fishserve.engine.engine import EngineEvent, GenerationRequest
from fishserve.server import pipeline
from fishserve.server.pipeline import Playback, SynthesisTimeoutError, early_chunk_frames


def frame_event(rid: str = "r") -> EngineEvent:
    return EngineEvent(rid, codes=np.zeros(4, dtype=np.int64))


def test_playback_asks_for_an_early_chunk_only_near_its_end(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(pipeline.time, "monotonic", lambda: now[0])
    playback = Playback(sample_rate=1000, early_frames=5)
    assert playback.due() is None and playback.early_frames() is None  # nothing played yet
    playback.add(1000)  # one second of audio from t=100
    assert playback.due() == 101.0 and playback.hurry_at() == 101.0 - pipeline.EARLY_CHUNK_S
    now[0] = 100.5
    assert playback.early_frames() is None
    now[0] = 100.8
    assert playback.early_frames() == 5
    playback.add(1000)
    assert playback.due() == 102.0 and playback.early_frames() is None


def test_a_smaller_margin_asks_for_the_early_chunk_later(monkeypatch):
    now = [100.8]
    monkeypatch.setattr(pipeline.time, "monotonic", lambda: now[0])
    playback = Playback(sample_rate=1000, early_frames=5, margin=0.1)
    playback.start, playback.samples = 100.0, 1000  # one second of audio from t=100
    assert playback.hurry_at() == 100.9 and playback.early_frames() is None
    now[0] = 100.95
    assert playback.early_frames() == 5


def test_early_chunk_frames_is_half_the_first_chunk():
    assert early_chunk_frames(ChunkPolicy(first_chunk_frames=10)) == 5
    assert early_chunk_frames(ChunkPolicy(first_chunk_frames=1)) == 1


def test_next_events_returns_what_is_buffered_at_the_hurry_time():
    async def scenario() -> tuple[int, int]:
        stream = RequestStream("r", asyncio.get_running_loop())
        stream.put_in_loop(frame_event())
        stream.put_in_loop(frame_event())
        now = time.monotonic()
        early = await pipeline._next_events(stream, 10, now + 0.05, now + 30, 30)
        stream.put_in_loop(frame_event())
        # past the hurry time with events buffered: they come at once
        late = await pipeline._next_events(stream, 10, now - 1, now + 30, 30)
        return len(early), len(late)

    assert asyncio.run(scenario()) == (2, 1)


def test_next_events_past_the_hurry_time_waits_for_frames_then_times_out():
    async def scenario() -> None:
        stream = RequestStream("r", asyncio.get_running_loop())
        now = time.monotonic()
        await pipeline._next_events(stream, 2, now - 1, now + 0.1, 0.1)

    with pytest.raises(SynthesisTimeoutError):
        asyncio.run(scenario())


def test_no_hurry_time_waits_for_the_wanted_frames():
    async def scenario() -> int:
        loop = asyncio.get_running_loop()
        stream = RequestStream("r", loop)
        for delay in (0.01, 0.02, 0.03):
            loop.call_later(delay, stream.put_in_loop, frame_event())
        now = time.monotonic()
        return len(await pipeline._next_events(stream, 3, None, now + 30, 30))

    assert asyncio.run(scenario()) == 3


def test_playback_first_chunk_deadline_hurries_the_first_chunk(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(pipeline.time, "monotonic", lambda: now[0])
    playback = Playback(sample_rate=1000, early_frames=5, first_chunk_by=100.2)
    assert playback.hurry_at() == 100.2 and playback.early_frames() is None
    now[0] = 100.3
    assert playback.early_frames() == 5  # the first chunk is late: send what is there
    playback.add(1000)
    assert playback.hurry_at() == 101.3 - pipeline.EARLY_CHUNK_S  # then the playback clock


def test_first_chunk_deadline_sends_a_shorter_first_chunk_of_the_same_audio(tmp_path):
    from conftest import tiny_server_config

    from fishserve.engine.engine import GenerationRequest
    from fishserve.engine.sampling import SamplingParams
    from fishserve.server.runtime import build_local_runtime

    async def chunks(deadline: float | None) -> list[np.ndarray]:
        config = tiny_server_config(
            tmp_path, load_format="dummy", first_chunk_deadline=deadline, num_kv_blocks=128
        )
        runtime = build_local_runtime(config)
        try:
            request = GenerationRequest(
                "Hurry up.", params=SamplingParams(seed=5), max_new_tokens=30, ignore_eos=True
            )
            return [c.samples async for c in pipeline.synthesize(runtime, request, 60.0)]
        finally:
            runtime.shutdown()

    frame = 256  # tiny decoder samples per frame
    patient = asyncio.run(chunks(None))
    hurried = asyncio.run(chunks(1e-6))  # past due as soon as the request arrives
    assert len(patient[0]) == 10 * frame  # first_chunk_frames
    assert 5 * frame <= len(hurried[0]) < 10 * frame  # at least half of it, sooner
    assert np.allclose(np.concatenate(hurried), np.concatenate(patient), atol=1e-5)


def test_deadlines_and_queue_time_count_from_the_given_arrival(tmp_path):
    """The HTTP arrival (`arrival`), not the pipeline's start, starts the request's clocks."""
    from conftest import tiny_server_config

    from fishserve.engine.engine import GenerationRequest
    from fishserve.engine.sampling import SamplingParams
    from fishserve.server.runtime import build_local_runtime

    config = tiny_server_config(
        tmp_path, load_format="dummy", first_chunk_deadline=0.5, num_kv_blocks=128
    )
    runtime = build_local_runtime(config)

    def request() -> GenerationRequest:
        params = SamplingParams(seed=5)
        return GenerationRequest("Hurry up.", params=params, max_new_tokens=30, ignore_eos=True)

    async def first_chunk(timeout: float, arrival: float) -> pipeline.AudioChunk:
        async for chunk in pipeline.synthesize(runtime, request(), timeout, arrival):
            return chunk
        raise AssertionError("no audio")

    try:
        late = asyncio.run(first_chunk(60.0, time.monotonic() - 1.0))  # 1 s queued upstream
        assert 5 * 256 <= len(late.samples) < 10 * 256  # past the 0.5 s deadline: hurried
        assert late.queue_seconds is not None and late.queue_seconds >= 1.0
        with pytest.raises(SynthesisTimeoutError):
            asyncio.run(first_chunk(5.0, time.monotonic() - 10.0))  # timed out on arrival
    finally:
        runtime.shutdown()


@pytest.fixture(scope="module")
def tiny_runtime(tmp_path_factory):
    """An in-process runtime on the tiny fixture models (real weights)."""
    from conftest import tiny_server_config

    from fishserve.server.runtime import build_local_runtime

    config = tiny_server_config(tmp_path_factory.mktemp("pipeline"), num_kv_blocks=128)
    runtime = build_local_runtime(config)
    yield runtime
    runtime.shutdown()


def eos_request(**overrides: object) -> GenerationRequest:
    """The fixture case that ends with the end token after 31 audio frames (of 40 allowed)."""
    import json

    from conftest import TINY_T2S
    from safetensors.torch import load_file

    from fishserve.engine.sampling import SamplingParams
    from fishserve.models.prompt import Reference

    meta = json.loads((TINY_T2S / "meta.json").read_text())
    codes = load_file(TINY_T2S / "generate_long_case.safetensors")["ref_codes"]
    greedy = SamplingParams(temperature=1e-5, top_p=0.9, repetition_penalty=1.0)
    text = meta["eos_case"]["segment_text"]
    return replace(
        GenerationRequest(text, [Reference(codes, meta["ref_text"])], greedy, 0, 40), **overrides
    )


@pytest.mark.parametrize(
    ("overrides", "reason", "frames"),
    [({}, "stop", 31), ({"max_new_tokens": 10}, "length", 9), ({"ignore_eos": True}, "length", 39)],
)
def test_the_last_chunk_says_why_generation_ended(tiny_runtime, overrides, reason, frames):
    async def chunks() -> list[pipeline.AudioChunk]:
        request = eos_request(**overrides)
        return [c async for c in pipeline.synthesize(tiny_runtime, request, 60.0)]

    out = asyncio.run(chunks())
    assert sum(len(c.samples) for c in out) == frames * 256
    assert [c.finish_reason for c in out] == [None] * (len(out) - 1) + [reason]


class HeldEngine:
    """A stand-in `AsyncEngine`: `submit` returns a stream holding ten frames; the test ends
    it. `engine` is the real `LLMEngine` (for the runtime's context size)."""

    def __init__(self, engine: object) -> None:
        self.engine = engine
        self.stream: RequestStream | None = None

    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop):
        self.stream = RequestStream(request.request_id, loop)
        for _ in range(10):  # exactly the first chunk (first_chunk_frames)
            self.stream.put_in_loop(frame_event(request.request_id))
        return self.stream

    def cancel(self, request_id: str) -> None:
        pass


def test_a_stream_whose_audio_is_all_out_ends_with_an_empty_chunk_and_its_reason(tiny_runtime):
    engine = HeldEngine(tiny_runtime.engine.engine)
    runtime = replace(tiny_runtime, engine=engine)

    async def scenario() -> tuple[pipeline.AudioChunk, list[pipeline.AudioChunk]]:
        request = GenerationRequest("Held.")
        chunks = pipeline.synthesize(runtime, request, 60.0)
        head = await anext(chunks)  # all ten frames decoded before the engine says "done"
        assert engine.stream is not None
        end = EngineEvent(request.request_id, finished=True, finish_reason="length")
        engine.stream.put_in_loop(end)
        return head, [c async for c in chunks]

    head, rest = asyncio.run(scenario())
    assert len(head.samples) == 10 * 256 and head.finish_reason is None
    assert [(len(c.samples), c.finish_reason) for c in rest] == [(0, "length")]


def test_a_client_that_ran_dry_waits_for_the_rebuffer_frames(monkeypatch):
    """Near its end the client gets an early chunk of `early_frames`; once it has run out of
    audio, of `rebuffer_frames`; a smaller rebuffer never lowers the early floor."""
    now = [100.0]
    monkeypatch.setattr(pipeline.time, "monotonic", lambda: now[0])
    playback = Playback(sample_rate=1000, early_frames=5, rebuffer_frames=16)
    assert playback.early_frames() is None  # no first chunk and no first-chunk deadline
    playback.add(1000)  # one second of audio from t=100
    now[0] = 100.9
    assert playback.early_frames() == 5  # within the margin, still playing
    now[0] = 101.0
    assert playback.early_frames() == 16  # ran out of audio
    playback.add(1000)
    assert playback.early_frames() is None  # playing again, not near its end
    low = Playback(sample_rate=1000, early_frames=5, rebuffer_frames=2)
    low.add(1000)  # from t=101
    now[0] = 102.5  # ran out of audio
    assert low.early_frames() == 5


class PacedEngine:
    """A stand-in engine: one frame of 4 codes per millisecond, then a final event."""

    def __init__(self, frames: int) -> None:
        self.frames = frames

    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> RequestStream:
        stream = RequestStream(request.request_id, loop)
        for i in range(self.frames):
            loop.call_later(0.001 * (i + 1), stream.put_in_loop, frame_event(request.request_id))
        final = EngineEvent(request.request_id, finished=True, finish_reason="length")
        loop.call_later(0.001 * (self.frames + 1), stream.put_in_loop, final)
        return stream

    def cancel(self, request_id: str) -> None:
        pass


class InstantDecoder:
    """A stand-in decoder thread: silence for each chunk's new frames, at once."""

    def __init__(self, frame_samples: int) -> None:
        self.frame_samples = frame_samples

    def submit(
        self, job: DecodeJob, deadline: float | None = None, request_id: str = ""
    ) -> Future[np.ndarray]:
        future: Future[np.ndarray] = Future()
        future.set_result(np.zeros(job.new_frames * self.frame_samples, np.float32))
        return future


@pytest.mark.parametrize(("rebuffer", "least"), [(0, 5), (30, 20)])
def test_a_stream_behind_its_client_sends_chunks_of_at_least_the_rebuffer_frames(
    monkeypatch: pytest.MonkeyPatch, rebuffer: int, least: int
) -> None:
    """With the client always out of audio, each chunk between the first and the last goes
    out once `early_chunk_frames` (5) frames are pending, or with `rebuffer_frames` (30,
    capped by the schedule's 20 for the second chunk) once that many are."""
    from fishserve.models.firefly.config import FireflyConfig

    config = FireflyConfig.from_file(
        Path(__file__).parents[1] / "fixtures/tiny_decoder/config.json"
    )
    monkeypatch.setattr(Playback, "due", lambda self: None if self.start is None else 0.0)
    runtime = SimpleNamespace(
        engine=PacedEngine(150),
        decoder=config,
        decode_worker=InstantDecoder(config.frame_samples),
        chunk_policy=ChunkPolicy(rebuffer_frames=rebuffer),
        stateful_decoder=False,
        first_chunk_deadline=None,
        early_chunk_margin=0.1,
        sample_rate=config.sample_rate,
        max_seq_len=4096,
    )
    request = GenerationRequest("Behind.", max_new_tokens=150, ignore_eos=True)

    async def frames() -> list[int]:
        return [c.frames async for c in pipeline.synthesize(runtime, request, 60.0)]

    sizes = [n for n in asyncio.run(frames()) if n]  # not an empty last chunk
    assert sum(sizes) == 150 and sizes[0] == 10
    assert all(n >= least for n in sizes[1:-1]), sizes
    if rebuffer == 0:  # an instant decoder: each chunk goes at the early floor, long before 20
        assert min(sizes[1:-1]) < 20, sizes


def test_a_negative_rebuffer_is_refused() -> None:
    with pytest.raises(ValueError, match="rebuffer_frames"):
        ChunkPolicy(rebuffer_frames=-1)
