"""The speech endpoints on a real uvicorn server with the tiny fixture models."""

from __future__ import annotations

import io
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import ormsgpack
import pytest
import soundfile as sf
from conftest import LiveServer, assert_same_pcm, tiny_server_config

from fishserve.server.metrics import Metrics
from fishserve.server.service import Synthesis, _record_finish

FRAME_SAMPLES = 256  # tiny decoder
FIXED = {"max_new_tokens": 12, "ignore_eos": True, "seed": 7}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with LiveServer(tiny_server_config(tmp_path_factory.mktemp("srv"))) as live:
        yield live


def tts(server, body: dict, **kwargs) -> httpx.Response:
    return httpx.post(server.url + "/v1/tts", json=body, timeout=120, **kwargs)


def pcm(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2")


def test_tts_returns_wav_of_the_expected_length(server):
    response = tts(server, {"text": "Hello there.", **FIXED})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "audio/wav"
    audio, rate = sf.read(io.BytesIO(response.content), dtype="int16")
    assert rate == 44100
    assert len(audio) == (FIXED["max_new_tokens"] - 1) * FRAME_SAMPLES  # first frame not audio


def test_long_text_is_generated_segment_by_segment(server):
    text = "First sentence is here. " * 5 + "And a second part follows it, much later on."
    response = tts(server, {"text": text, "chunk_length": 100, "format": "pcm", **FIXED})
    assert response.status_code == 200
    frames = len(pcm(response.content)) // FRAME_SAMPLES
    assert frames % (FIXED["max_new_tokens"] - 1) == 0 and frames >= 2 * 11


def test_msgpack_and_json_give_the_same_audio(server):
    body = {"text": "Same audio either way.", "format": "pcm", **FIXED}
    as_json = tts(server, body)
    as_msgpack = httpx.post(
        server.url + "/v1/tts",
        content=ormsgpack.packb(body),
        headers={"content-type": "application/msgpack"},
        timeout=120,
    )
    assert as_json.status_code == as_msgpack.status_code == 200
    assert_same_pcm(as_json.content, as_msgpack.content)


@pytest.mark.parametrize("fmt", ["pcm", "wav"])
def test_streaming_bytes_equal_non_streaming(server, fmt):
    body = {
        "text": "Streaming should not change the audio.",
        "format": fmt,
        **FIXED,
        "max_new_tokens": 40,
    }
    whole = tts(server, body)
    with httpx.stream(
        "POST", server.url + "/v1/tts", json={**body, "streaming": True}, timeout=120
    ) as response:
        chunks = list(response.iter_bytes())
    streamed = b"".join(chunks)
    if fmt == "pcm":
        assert_same_pcm(streamed, whole.content)
    else:  # the same header but for its two size fields in streaming (0xFFFFFFFF)
        assert streamed[:4] == whole.content[:4] and streamed[8:40] == whole.content[8:40]
        assert_same_pcm(streamed[44:], whole.content[44:])
        assert streamed[40:44] == b"\xff\xff\xff\xff"


@pytest.mark.parametrize("fmt", ["mp3", "opus", "flac"])
def test_compressed_formats_decode(server, fmt):
    response = tts(server, {"text": "Compressed.", "format": fmt, **FIXED})
    assert response.status_code == 200
    import av

    with av.open(io.BytesIO(response.content)) as container:
        samples = sum(frame.samples for frame in container.decode(audio=0))
    expected = (
        (FIXED["max_new_tokens"] - 1) * FRAME_SAMPLES * (48000 / 44100 if fmt == "opus" else 1)
    )
    assert abs(samples - expected) <= 1152


def test_concurrent_requests_each_equal_their_solo_result(server):
    bodies = [
        {
            "text": f"Request number {i} speaks.",
            "format": "pcm",
            "seed": i,
            "max_new_tokens": 8 + i,
            "ignore_eos": True,
        }
        for i in range(16)
    ]
    solo = [pcm(tts(server, b).content).astype(int) for b in bodies]
    results: dict[int, httpx.Response] = {}

    def call(i: int) -> None:
        results[i] = tts(server, bodies[i])

    threads = [threading.Thread(target=call, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(results[i].status_code == 200 for i in range(16))
    for i in range(16):
        assert len(pcm(results[i].content)) == (8 + i - 1) * FRAME_SAMPLES
    for i, alone in enumerate(solo):
        # Batched decoder convolutions round differently (~1e-7): at most 1 LSB of int16.
        assert np.abs(pcm(results[i].content).astype(int) - alone).max() <= 1


def test_openai_sdk_works_unchanged(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    speech = client.audio.speech.create(
        model="fish-speech-1.5",
        voice="default",
        input="Hello from the OpenAI SDK.",
        response_format="wav",
    )
    audio, rate = sf.read(io.BytesIO(speech.content))
    assert rate == 44100 and len(audio) > 0


def test_openai_flac_is_one_readable_file(server):
    """FLAC on the OpenAI route comes whole, so its header states the sample count that
    libsndfile needs (a streamed one says 0: unknown)."""
    body = {"input": "Lossless, please.", "voice": "default", "response_format": "flac"}
    response = httpx.post(server.url + "/v1/audio/speech", json=body, timeout=120)
    assert response.status_code == 200 and response.headers["content-type"] == "audio/flac"
    info = sf.info(io.BytesIO(response.content))
    audio, rate = sf.read(io.BytesIO(response.content))
    assert rate == 44100 and info.frames == len(audio) > 0
    assert len(audio) % FRAME_SAMPLES == 0


def test_openai_pcm_is_24_khz(server):
    body = {"input": "Raw samples.", "voice": "default", "response_format": "pcm"}
    response = httpx.post(server.url + "/v1/audio/speech", json=body, timeout=120)
    assert response.status_code == 200 and response.headers["x-sample-rate"] == "24000"
    samples = pcm(response.content).size
    frames = samples * 44100 / 24000 / FRAME_SAMPLES  # whole code frames at the model's rate
    assert samples > 0 and abs(frames - round(frames)) < 0.05
    assert samples % FRAME_SAMPLES != 0  # not 44.1 kHz frames left as they were


def test_openai_sse_stream(server):
    body = {
        "model": "x",
        "input": "Server sent events.",
        "voice": "default",
        "response_format": "pcm",
        "stream_format": "sse",
    }
    response = httpx.post(server.url + "/v1/audio/speech", json=body, timeout=120)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [line for line in response.text.splitlines() if line.startswith("data: ")]
    assert '"speech.audio.done"' in events[-1]
    assert any('"speech.audio.delta"' in e for e in events[:-1])


def test_disconnect_storm_frees_every_kv_block(server):
    body = {
        "text": "Disconnect me.",
        "format": "pcm",
        "streaming": True,
        "max_new_tokens": 400,
        "ignore_eos": True,
    }
    for _ in range(8):
        with httpx.stream("POST", server.url + "/v1/tts", json=body, timeout=60) as response:
            next(response.iter_bytes())  # some audio arrived, then the client goes away
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        health = httpx.get(server.url + "/health").json()
        kv = health["kv_cache"]
        if kv["blocks_free"] == kv["blocks_total"] and health["requests"]["running"] == 0:
            break
        time.sleep(0.1)
    assert kv["blocks_free"] == kv["blocks_total"]
    assert tts(server, {"text": "Still serving.", **FIXED}).status_code == 200


def test_health_and_metrics(server):
    health = httpx.get(server.url + "/v1/health").json()
    assert health["status"] == "ok"
    assert set(health["requests"]) == {"running", "waiting"}
    assert {"dtype", "block_size", "blocks_total", "blocks_free"} <= set(health["kv_cache"])
    assert health["gpu_memory"] is None  # CPU
    assert health["host_probe_ms"] > 0  # this machine's host speed, taken at start-up
    text = httpx.get(server.url + "/metrics").text
    for name in (
        "fishserve:num_requests_running",
        "fishserve:kv_cache_usage_perc",
        "fishserve:time_to_first_audio_seconds_bucket",
        "fishserve:generation_frames_total",
        "fishserve:request_success_total",
    ):
        assert name in text
    assert tts(server, {"text": "Count me.", **FIXED}).status_code == 200
    values = metric_values(httpx.get(server.url + "/metrics").text)
    assert values['fishserve:gpu_busy_seconds_total{component="llm"}'] > 0
    assert values['fishserve:gpu_busy_seconds_total{component="decoder"}'] > 0
    assert values["fishserve:decoder_calls_total"] >= 1
    assert values["fishserve:decoder_jobs_total"] >= values["fishserve:decoder_calls_total"]
    # every emitted frame is decoded once (the engine also counts frames it does not emit)
    decoded = values["fishserve:decoder_frames_total"]
    assert 0 < decoded <= values["fishserve:generation_frames_total"]
    assert values["fishserve:engine_steps_total"] >= 1


def metric_values(text: str) -> dict[str, float]:
    """Prometheus text -> {name{labels}: value} (comments skipped)."""
    pairs = (line.rsplit(" ", 1) for line in text.splitlines() if line and line[0] != "#")
    return {name: float(value) for name, value in pairs}


def test_sse_deltas_always_carry_audio(server):
    body = {"input": "Every event has audio.", "voice": "default", "response_format": "wav"}
    response = httpx.post(
        server.url + "/v1/audio/speech", json={**body, "stream_format": "sse"}, timeout=120
    )
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line[:6] == "data: "]
    deltas = [e["audio"] for e in events if e["type"] == "speech.audio.delta"]
    assert deltas and all(deltas)
    assert events[-1]["type"] == "speech.audio.done"


def test_random_weights_default_to_64_frames_per_segment(tmp_path):
    config = tiny_server_config(tmp_path, load_format="dummy", num_kv_blocks=128)
    with LiveServer(config) as live:
        body = {"text": "No frame count given.", "ignore_eos": True, "format": "pcm", "seed": 1}
        response = tts(live, body)
        assert len(pcm(response.content)) == 63 * FRAME_SAMPLES  # the first frame is no audio
        response = tts(live, {**body, "max_new_tokens": 5})
        assert len(pcm(response.content)) == 4 * FRAME_SAMPLES
        speech = {"input": "No frame count here.", "voice": "default", "response_format": "pcm"}
        response = httpx.post(live.url + "/v1/audio/speech", json=speech, timeout=120)
        assert 0 < len(pcm(response.content)) <= 63 * FRAME_SAMPLES


def test_engine_and_decoder_taking_turns_serve_the_same_audio(tmp_path):
    """gpu_sharing turns: steps and decoder calls alternate; the codes and audio are the same."""
    body = {"text": "Turns.", "ignore_eos": True, "max_new_tokens": 12, "format": "pcm", "seed": 3}
    audio = {}
    for sharing in ("overlap", "turns"):
        config = tiny_server_config(tmp_path / sharing, load_format="dummy", gpu_sharing=sharing)
        with LiveServer(config) as live:
            assert httpx.get(live.url + "/health").json()["model"]["gpu_sharing"] == sharing
            audio[sharing] = tts(live, {**body, "streaming": True}).content
    assert len(pcm(audio["turns"])) == 11 * FRAME_SAMPLES
    assert_same_pcm(audio["turns"], audio["overlap"])


def test_request_log_says_rtf_na_without_audio(caplog):
    with caplog.at_level(logging.INFO, logger="fishserve.server.service"):
        _record_finish(Synthesis(), Metrics(), 44100)
    assert "(RTF n/a)" in caplog.text and "nan" not in caplog.text


def test_metrics_count_work_across_a_model_reload():
    """A stopped runtime's totals are folded in; the next one counts from 0: nothing lost."""
    from types import SimpleNamespace

    from fishserve.engine.engine import EngineStats
    from fishserve.server.runtime import RuntimeStatus

    def runtime(frames: int, calls: int, busy: float) -> SimpleNamespace:
        stats = EngineStats(
            0, 0, 8, 8, 0, frames, busy, frames // 2, frames // 10, boost_steps=frames // 5
        )
        stats.admission_held, stats.stream_frame_rate = frames // 10, frames / 10
        status = RuntimeStatus(stats, True, None, False, busy, calls, frames, calls * 2)
        status.gil_wait_seconds, status.gil_wakeups = busy / 100, frames
        return SimpleNamespace(status=lambda: status, pending=lambda: 0)

    metrics = Metrics()
    metrics.update_runtime(runtime(40, 3, 2.0))  # a scrape
    metrics.retire_runtime(runtime(100, 5, 3.0))  # more work, then an idle unload
    metrics.update_runtime(runtime(150, 4, 1.0))  # the reloaded runtime did 150 frames
    values = metric_values(metrics.render().decode())
    assert values["fishserve:decoder_frames_total"] == 250
    assert values["fishserve:generation_frames_total"] == 250
    assert values["fishserve:engine_steps_total"] == 125
    assert values["fishserve:sampler_full_sort_rows_total"] == 25
    assert values["fishserve:engine_boost_steps_total"] == 50
    assert values["fishserve:admission_held_total"] == 25
    assert values["fishserve:stream_frame_rate"] == 15.0  # the live runtime's, a gauge
    assert values["fishserve:decoder_calls_total"] == 9
    assert values["fishserve:decoder_jobs_total"] == 18
    assert values['fishserve:gpu_busy_seconds_total{component="decoder"}'] == 4.0
    assert values["fishserve:gil_probe_wakeups_total"] == 250
    assert abs(values["fishserve:gil_wait_seconds_total"] - 0.04) < 1e-12


def test_the_pipeline_gets_the_request_s_arrival():
    """`stream_audio` hands its arrival time to the runtime (the request's deadlines count
    from it, also in the engine-core process)."""
    import asyncio
    from types import SimpleNamespace

    from fishserve.engine.engine import GenerationRequest
    from fishserve.server.pipeline import AudioChunk
    from fishserve.server.service import stream_audio

    seen: list[float | None] = []

    async def synthesize(request, timeout: float, arrival: float | None = None):
        seen.append(arrival)
        yield AudioChunk(np.zeros(256, np.float32), 0.0)

    runtime = SimpleNamespace(synthesize=synthesize, sample_rate=44100)

    async def run() -> None:
        async for _ in stream_audio(runtime, GenerationRequest("Hi."), Metrics(), 60.0):
            pass

    before = time.monotonic()
    asyncio.run(run())
    assert len(seen) == 1 and seen[0] is not None and before <= seen[0] <= time.monotonic()


@pytest.mark.parametrize("reason", ["stop", "length"])
def test_successes_are_counted_by_their_finish_reason(reason):
    """The last chunk's finish reason labels the success; a last chunk without samples (all
    audio was out before the end) is not passed on."""
    import asyncio
    from types import SimpleNamespace

    from fishserve.engine.engine import GenerationRequest
    from fishserve.server.pipeline import AudioChunk
    from fishserve.server.service import stream_audio

    async def synthesize(request, timeout: float, arrival: float | None = None):
        yield AudioChunk(np.zeros(256, np.float32), 0.0)
        yield AudioChunk(np.zeros(0, np.float32), finish_reason=reason)

    runtime = SimpleNamespace(synthesize=synthesize, sample_rate=44100)
    metrics = Metrics()

    async def run() -> list[np.ndarray]:
        request = GenerationRequest("Hi.")
        return [c async for c in stream_audio(runtime, request, metrics, 60.0)]

    assert [len(c) for c in asyncio.run(run())] == [256]
    values = metric_values(metrics.render().decode())
    assert values[f'fishserve:request_success_total{{finished_reason="{reason}"}}'] == 1
    other = "stop" if reason == "length" else "length"
    assert f'fishserve:request_success_total{{finished_reason="{other}"}}' not in values


def test_asynchronous_scheduling_serves_the_same_audio(tmp_path):
    """async_scheduling on (the engine launches a step before reading the last one's frames):
    concurrent requests get the audio they get with it off."""
    bodies = [
        {"text": f"Async {i}.", "ignore_eos": True, "max_new_tokens": 6 + i, "format": "pcm"}
        for i in range(4)
    ]
    audio: dict[str, list[np.ndarray]] = {}
    for setting in ("off", "on"):
        on = setting == "on"
        config = tiny_server_config(
            tmp_path / setting, async_scheduling=on, compile_fast_transformer=not on
        )
        with LiveServer(config) as live:
            health = httpx.get(live.url + "/health").json()
            assert health["model"]["async_scheduling"] is on
            assert health["model"]["compile_fast_transformer"] is not on
            with ThreadPoolExecutor(4) as pool:
                replies = list(pool.map(lambda b: tts(live, {**b, "seed": 5}), bodies))
            assert all(r.status_code == 200 for r in replies)
            audio[setting] = [pcm(r.content).astype(int) for r in replies]
    for on, off in zip(audio["on"], audio["off"], strict=True):
        assert len(on) == len(off) and np.abs(on - off).max() <= 1


def test_openai_model_list_and_retrieval(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    models = client.models.list().data
    assert [m.id for m in models] == ["fish-speech-1.5"]
    assert client.models.retrieve("fish-speech-1.5").owned_by == "fishserve"
    with pytest.raises(openai.NotFoundError, match="tts-1"):
        client.models.retrieve("tts-1")


@pytest.mark.parametrize(
    "path",
    ["/health", "/metrics", "/v1/models", "/v1/models/fish-speech-1.5", "/v1/references/list"],
)
def test_head_works_wherever_get_does(server, path):
    """Monitors and load balancers probe with HEAD: the GET's status and type, no body."""
    get, head = httpx.get(server.url + path), httpx.head(server.url + path)
    assert get.status_code == head.status_code == 200
    assert head.headers["content-type"] == get.headers["content-type"] and head.content == b""
