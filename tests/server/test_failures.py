"""Failures during synthesis: streams that fail part-way, clients that leave, requests with no
room for audio, and how each is counted in the metrics."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import numpy as np
import pytest
from conftest import LiveServer, tiny_server_config

import fishserve.server.streaming as streaming
from fishserve.server.routes_tts import history_window

# Two segments on the 256-position tiny model: the second prompt cannot fit, after the first
# segment's audio has been streamed (30 frames > the 10 of the first chunk).
TWO_SEGMENTS = {
    "text": ("x" * 150 + ". ") * 2,
    "chunk_length": 150,
    "seed": 1,
    "ignore_eos": True,
    "max_new_tokens": 30,
}
LONG = {"text": "Take your time.", "max_new_tokens": 200, "ignore_eos": True, "format": "pcm"}
REASONS = ("stop", "length")  # the finish reasons of successful requests


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with LiveServer(tiny_server_config(tmp_path_factory.mktemp("fail"))) as live:
        yield live


def metric(server: LiveServer, sample: str) -> float:
    """Value of one Prometheus sample (0 if absent), e.g. `name{label="x"}`."""
    for line in httpx.get(server.url + "/metrics").text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


SUMS = ("_sum", "_count")


def failures(server: LiveServer, reason: str) -> float:
    return metric(server, f'fishserve:request_failure_total{{reason="{reason}"}}')


def successes(server: LiveServer) -> float:
    """Requests counted as successes, whatever their finish reason."""
    samples = [f'fishserve:request_success_total{{finished_reason="{r}"}}' for r in REASONS]
    return sum(metric(server, sample) for sample in samples)


@contextlib.contextmanager
def patched_steps(server: LiveServer, hook: Callable[[int], None]) -> Iterator[None]:
    """Call `hook(step_number)` on the engine thread before each model step."""
    runner = server.state.runtime.engine.engine.runner
    original, calls = runner.execute, [0]

    def execute(batch):
        calls[0] += 1
        hook(calls[0])
        return original(batch)

    runner.execute = execute
    try:
        yield
    finally:
        del runner.execute


def fail_after(steps: int) -> Callable[[int], None]:
    def hook(n: int) -> None:
        if n > steps:
            raise RuntimeError("injected engine failure")

    return hook


@contextlib.contextmanager
def without_eos(server: LiveServer) -> Iterator[None]:
    """Every request generates its whole frame budget (deterministic lengths)."""
    engine = server.state.runtime.engine
    original = engine.submit
    engine.submit = lambda req, loop=None: original(dataclasses.replace(req, ignore_eos=True), loop)
    try:
        yield
    finally:
        del engine.submit


def wait_until_idle(server: LiveServer, limit: float) -> float:
    """Seconds until no request runs and every KV block is free (fails after `limit`)."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        health = httpx.get(server.url + "/health").json()
        kv = health["kv_cache"]
        if health["requests"]["running"] == 0 and kv["blocks_free"] == kv["blocks_total"]:
            return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(f"KV blocks still in use after {limit} s")


def send_raw(server: LiveServer, body: dict, path: str = "/v1/tts") -> socket.socket:
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode()
        + f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    return sock


def wait_until_running(server: LiveServer, limit: float = 10.0) -> None:
    """Block until the engine runs a request (fails after `limit` seconds)."""
    deadline = time.monotonic() + limit
    while httpx.get(server.url + "/health").json()["requests"]["running"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)


class Records(logging.Handler):
    """Collects the records of one logger (uvicorn's do not propagate to caplog)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_audio_stream_failing_midway_ends_without_terminating_chunk(server, caplog):
    before = failures(server, "invalid"), successes(server)
    uvicorn_log = Records()
    logging.getLogger("uvicorn.error").addHandler(uvicorn_log)
    body = {**TWO_SEGMENTS, "streaming": True, "format": "wav"}
    received = b""
    with (
        pytest.raises(httpx.RemoteProtocolError),
        httpx.stream("POST", server.url + "/v1/tts", json=body, timeout=60) as response,
    ):
        assert response.status_code == 200
        for part in response.iter_bytes():
            received += part
    logging.getLogger("uvicorn.error").removeHandler(uvicorn_log)
    assert len(received) > 44  # audio was sent before the failure
    assert not uvicorn_log.records  # no traceback, no "returned without completing response"
    assert (failures(server, "invalid"), successes(server)) == (before[0] + 1, before[1])
    lines = [r for r in caplog.records if "failed after the response started" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is None


def test_engine_error_midstream_is_a_failure_not_a_success(server):
    before = failures(server, "error"), successes(server)
    body = {**LONG, "streaming": True}
    with (
        patched_steps(server, fail_after(20)),
        pytest.raises(httpx.RemoteProtocolError),
        httpx.stream("POST", server.url + "/v1/tts", json=body, timeout=60) as response,
    ):
        assert response.status_code == 200
        for _ in response.iter_bytes():
            pass
    with patched_steps(server, fail_after(5)):
        whole = httpx.post(server.url + "/v1/tts", json=LONG, timeout=60)
    assert whole.status_code == 500 and "injected engine failure" in whole.json()["message"]
    assert (failures(server, "error"), successes(server)) == (before[0] + 2, before[1])


def test_sse_failure_sends_an_error_event_and_no_done(server):
    body = {
        "input": TWO_SEGMENTS["text"],
        "voice": "default",
        "response_format": "pcm",
        "stream_format": "sse",
    }
    with without_eos(server):
        response = httpx.post(server.url + "/v1/audio/speech", json=body, timeout=60)
    assert response.status_code == 200
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line[:6] == "data: "]
    assert events[0]["type"] == "speech.audio.delta"
    assert events[-1]["type"] == "error" and "context" in events[-1]["error"]["message"]
    assert all(e["type"] != "speech.audio.done" for e in events)


def test_non_streaming_disconnect_frees_kv_blocks_at_once(server):
    cancelled = failures(server, "cancelled")
    with patched_steps(server, lambda n: time.sleep(0.02)):  # 200 frames: over 4 s
        sock = send_raw(server, LONG)
        wait_until_running(server)
        sock.close()
        assert wait_until_idle(server, limit=2.0) < 2.0
    assert failures(server, "cancelled") == cancelled + 1


def test_queue_time_ends_at_the_first_frame_not_the_first_chunk(server):
    """An idle server's queue time is the first frame's wait (two slow steps), not the
    first audio chunk's (eleven)."""
    name = "fishserve:request_queue_time_seconds"
    total, count = metric(server, name + "_sum"), metric(server, name + "_count")
    with patched_steps(server, lambda n: time.sleep(0.1)):
        body = {**LONG, "max_new_tokens": 12}
        assert httpx.post(server.url + "/v1/tts", json=body, timeout=60).status_code == 200
    assert metric(server, name + "_count") == count + 1
    assert metric(server, name + "_sum") - total < 0.6  # ~0.2 s; the first chunk: ~1.1 s


def test_first_chunk_metrics_time_the_decoder_and_count_its_frames(server):
    """The first chunk's decoder time covers a slow decoder call (0.3 s), and its frames are
    the policy's first chunk (10 of the 11 audio frames of 12 generated)."""
    seconds, frames = "fishserve:first_chunk_decode_seconds", "fishserve:first_chunk_frames"
    before = [metric(server, name + suffix) for name in (seconds, frames) for suffix in SUMS]
    runner = server.state.runtime.decode_worker.runner
    original = runner.start_jobs

    def slow_start(jobs):
        time.sleep(0.3)
        return original(jobs)

    runner.start_jobs = slow_start
    try:
        body = {**LONG, "max_new_tokens": 12}
        assert httpx.post(server.url + "/v1/tts", json=body, timeout=60).status_code == 200
    finally:
        del runner.start_jobs
    after = [metric(server, name + suffix) for name in (seconds, frames) for suffix in SUMS]
    decode_s, decode_n, frames_sum, frames_n = (a - b for a, b in zip(after, before, strict=True))
    assert (decode_n, frames_n) == (1, 1)
    assert 0.3 <= decode_s < 5.0
    assert frames_sum == 10


@pytest.mark.parametrize("path", ["/v1/tts", "/v1/audio/speech"])
def test_stream_disconnect_before_the_first_chunk_cancels_at_once(server, path):
    """A streaming client that leaves while its first chunk is still being generated is
    cancelled within the disconnect poll, not when that chunk is ready (11 slow steps here)."""
    cancelled = failures(server, "cancelled")
    body = (
        {**LONG, "streaming": True}
        if path == "/v1/tts"
        else {"input": LONG["text"], "voice": "default", "stream_format": "sse"}
    )
    with patched_steps(server, lambda n: time.sleep(0.3)):  # first chunk after ~3.3 s
        sock = send_raw(server, body, path)
        wait_until_running(server)
        sock.close()
        assert wait_until_idle(server, limit=1.5) < 1.5
    assert failures(server, "cancelled") == cancelled + 1


@pytest.mark.parametrize("streaming", [False, True])
def test_no_room_for_audio_is_a_400(server, streaming):
    # 240 x's make a 255-position prompt: one frame of room, and the first is never audio.
    body = {"text": "x" * 240, "chunk_length": 300, "streaming": streaming, "format": "mp3"}
    response = httpx.post(server.url + "/v1/tts", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert "no room for audio" in response.json()["message"]


def test_later_segment_that_cannot_fit_is_a_400_before_anything_is_sent(server):
    response = httpx.post(server.url + "/v1/tts", json=TWO_SEGMENTS, timeout=60)
    assert response.status_code == 400, response.text
    assert "does not fit the model's context" in response.json()["message"]


def test_history_window_is_capped_by_the_model_context():
    assert history_window(32768) == 4096
    assert history_window(2048) == 2048  # 1024 positions of history, 1024 left to generate
    assert history_window(256) == 4096  # no window fits: the whole history is kept


def test_abandoned_compressed_streams_release_their_encoder(server, monkeypatch):
    made, push_threads = [], []
    loop_thread = server.thread.ident

    def spy(fmt, sample_rate):
        encoder = original(fmt, sample_rate)
        push = encoder.push

        def traced_push(chunk):
            push_threads.append(threading.get_ident())
            return push(chunk)

        encoder.push = traced_push
        made.append(encoder)
        return encoder

    original = streaming.stream_encoder
    monkeypatch.setattr(streaming, "stream_encoder", spy)
    body = {**LONG, "streaming": True, "format": "mp3"}
    with httpx.stream("POST", server.url + "/v1/tts", json=body, timeout=60) as response:
        next(response.iter_bytes())  # then hang up
    deadline = time.monotonic() + 5
    while not made[0]._finished and time.monotonic() < deadline:
        time.sleep(0.05)
    assert made[0]._finished
    assert push_threads and loop_thread not in push_threads  # encoded off the event loop


def test_idle_clock_restarts_when_a_stream_ends(server):
    body = {**LONG, "max_new_tokens": 60, "streaming": True}
    with httpx.stream("POST", server.url + "/v1/tts", json=body, timeout=60) as response:
        chunks = response.iter_bytes()
        next(chunks)
        first_byte = time.monotonic()
        for _ in chunks:
            pass
    assert server.state.last_activity > first_byte


def test_a_failure_after_audio_is_counted_once(tmp_path):
    """A non-streamed request whose engine dies after some audio: one failure, not also a 503
    refusal."""
    from fishserve.engine.async_engine import EngineDeadError
    from fishserve.server.pipeline import AudioChunk

    with LiveServer(tiny_server_config(tmp_path)) as live:

        async def dies_after_audio(request, timeout, arrival=None):
            yield AudioChunk(np.zeros(256, dtype=np.float32), 0.0)
            raise EngineDeadError("the engine process is not running")

        live.state.runtime.synthesize = dies_after_audio
        response = httpx.post(live.url + "/v1/tts", json={"text": "Hi."}, timeout=60)
        assert response.status_code == 503
        assert failures(live, "error") == 1
        assert failures(live, "overloaded") == 0


def test_a_response_cancelled_at_shutdown_is_one_warning_not_a_traceback():
    import asyncio
    import logging

    from fishserve.server.app import _ABORT_FILTER

    try:
        raise asyncio.CancelledError("Task cancelled, timeout graceful shutdown exceeded")
    except asyncio.CancelledError:
        import sys

        info = sys.exc_info()
    record = logging.LogRecord(
        "uvicorn.error", logging.ERROR, __file__, 1, "Exception in ASGI application\n", (), info
    )
    assert _ABORT_FILTER.filter(record)
    assert record.levelname == "WARNING" and record.exc_info is None
    assert "graceful shutdown exceeded" in record.getMessage()
    other = logging.LogRecord(
        "uvicorn.error", logging.ERROR, __file__, 1, "Exception in ASGI application\n", (), None
    )
    assert _ABORT_FILTER.filter(other) and other.levelname == "ERROR"  # real errors stay


@pytest.mark.parametrize("exc", [MemoryError("Unable to allocate 373. GiB"), RuntimeError("bug")])
def test_an_unexpected_error_before_any_audio_is_a_counted_500(server, monkeypatch, exc, caplog):
    """A failure no handler knows (MemoryError) or a bug (RuntimeError), raised before the
    stream starts: a JSON 500, logged, and counted once as an error."""
    import fishserve.server.routes_tts as routes

    async def fails(*args, **kwargs):
        raise exc

    monkeypatch.setattr(routes, "references_of", fails)
    before = failures(server, "error")
    with caplog.at_level(logging.ERROR):
        response = httpx.post(server.url + "/v1/tts", json={"text": "Hi."}, timeout=60)
    assert response.status_code == 500 and response.json()["statusCode"] == 500
    assert failures(server, "error") == before + 1
