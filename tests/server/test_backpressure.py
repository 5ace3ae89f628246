"""Busy and overload answers, API key, lazy loading."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from conftest import LiveServer, tiny_server_config

from fishserve.engine.engine import GenerationRequest

LONG = {
    "text": "Keep the engine busy.",
    "max_new_tokens": 3000,
    "ignore_eos": True,
    "streaming": True,
    "format": "pcm",
}


def metrics(live: LiveServer) -> str:
    return httpx.get(live.url + "/metrics").text


def hold_stream(url: str, stop: threading.Event) -> None:
    """Stream a long request until `stop` is set, then hang up."""
    with httpx.Client(timeout=60) as client, client.stream("POST", url, json=LONG) as response:
        for _ in response.iter_bytes():
            if stop.is_set():
                return


def test_queue_overflow_gives_429_with_retry_after(tmp_path):
    config = tiny_server_config(tmp_path, max_num_seqs=1, max_waiting=1)
    with LiveServer(config) as live:
        stop = threading.Event()
        holders = [
            threading.Thread(target=hold_stream, args=(live.url + "/v1/tts", stop))
            for _ in range(2)
        ]  # one running, one waiting
        for t in holders:
            t.start()
        try:
            for _ in range(200):
                stats = live.state.runtime.engine.stats()
                if stats.running == 1 and stats.waiting == 1:
                    break
                threading.Event().wait(0.05)
            busy = httpx.post(live.url + "/v1/tts", json={"text": "One more."}, timeout=60)
            assert busy.status_code == 429, busy.text
            assert busy.headers["retry-after"]
            assert httpx.get(live.url + "/health").json()["status"] == "busy"
            text = metrics(live)
            assert 'request_failure_total{reason="busy"} 1.0' in text
            assert 'request_failure_total{reason="error"}' not in text  # counted once
        finally:
            stop.set()
            for t in holders:
                t.join(60)


def test_critical_memory_gives_503(tmp_path):
    with LiveServer(tiny_server_config(tmp_path)) as live:
        live.state.runtime.memory_critical = lambda: True
        response = httpx.post(live.url + "/v1/tts", json={"text": "Hi."}, timeout=60)
        assert response.status_code == 503 and response.headers["retry-after"]
        assert httpx.post(live.url + "/v1/tts", json={"text": ""}).status_code == 422
        text = metrics(live)
        assert 'request_failure_total{reason="overloaded"} 1.0' in text
        assert 'request_failure_total{reason="invalid"} 1.0' in text


def test_timeout_also_while_queued(tmp_path):
    config = tiny_server_config(tmp_path, max_num_seqs=1, request_timeout=0.5)
    with LiveServer(config) as live:
        engine = live.state.runtime.engine
        holder = GenerationRequest("Hold the only slot.", max_new_tokens=200, ignore_eos=True)
        events = iter(engine.submit(holder))
        next(events)  # running: anything else waits
        try:
            start = time.monotonic()
            queued = httpx.post(live.url + "/v1/tts", json={"text": "Wait."}, timeout=60)
            assert queued.status_code == 504, queued.text
            assert time.monotonic() - start < 1.2  # not when the slot frees (~2 s)
            assert 'request_failure_total{reason="timeout"} 1.0' in metrics(live)
        finally:
            engine.cancel(holder.request_id)


def test_timeout_also_while_waiting_for_the_decoder(tmp_path):
    """The request deadline covers the audio decoder too: a stuck decoder call gives a 504
    at the deadline, not when the call returns."""
    config = tiny_server_config(tmp_path, request_timeout=1.0)
    with LiveServer(config) as live:
        runner = live.state.runtime.decode_worker.runner
        slow, original = threading.Event(), runner.start_jobs

        def stuck(jobs):
            slow.wait(5)  # released at the end of the test
            return original(jobs)

        runner.start_jobs = stuck
        try:
            start = time.monotonic()
            body = {"text": "Hi.", "max_new_tokens": 20, "ignore_eos": True}
            response = httpx.post(live.url + "/v1/tts", json=body, timeout=60)
            assert response.status_code == 504, response.text
            assert time.monotonic() - start < 2.0  # the decoder would take 5 s
        finally:
            slow.set()
            runner.start_jobs = original


def test_api_key(tmp_path):
    with LiveServer(tiny_server_config(tmp_path, api_key="s3cret")) as live:
        body = {"text": "Hi.", "max_new_tokens": 3}
        assert httpx.post(live.url + "/v1/tts", json=body).status_code == 401
        assert (
            httpx.post(
                live.url + "/v1/tts", json=body, headers={"Authorization": "Bearer wrong"}
            ).status_code
            == 401
        )
        ok = httpx.post(
            live.url + "/v1/tts", json=body, timeout=60, headers={"Authorization": "Bearer s3cret"}
        )
        assert ok.status_code == 200
        assert httpx.get(live.url + "/health").status_code == 200  # open for load balancers
        for header, status in [("bearer s3cret", 200), ("Bearer S3CRET", 401), ("s3cret", 401)]:
            answer = httpx.post(
                live.url + "/v1/tts", json=body, timeout=60, headers={"Authorization": header}
            )
            assert answer.status_code == status, header  # the scheme's case does not matter


def test_lazy_load_and_idle_unload(tmp_path):
    config = tiny_server_config(tmp_path, lazy_load=True, idle_unload_seconds=0.5)
    with LiveServer(config) as live:
        assert httpx.get(live.url + "/health").json()["loaded"] is False
        body = {"text": "Load on demand.", "max_new_tokens": 3}
        assert httpx.post(live.url + "/v1/tts", json=body, timeout=60).status_code == 200
        assert live.state.runtime is not None
        for _ in range(150):
            if live.state.runtime is None:
                break
            threading.Event().wait(0.1)
        assert live.state.runtime is None


MULTIPART_START = b'--b\r\nContent-Disposition: form-data; name="id"\r\n\r\nme\r\n'


@pytest.mark.parametrize(
    ("path", "kind", "prefix"),
    [
        ("/v1/tts", "application/json", b'{"text": '),
        ("/v1/references/add", "multipart/form-data; boundary=b", MULTIPART_START),
    ],
)
def test_a_stalled_upload_gets_a_408_at_the_request_timeout(tmp_path, path, kind, prefix):
    """The request timeout counts from arrival, body upload included: a client that sends
    its headers and part of its body, then stalls, gets a 408, not an open connection."""
    import socket

    with LiveServer(tiny_server_config(tmp_path, request_timeout=1.0)) as live:
        with socket.create_connection(("127.0.0.1", live.port), timeout=10) as sock:
            head = (
                f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {kind}\r\n"
                "Content-Length: 100\r\n\r\n"
            )
            start = time.monotonic()
            sock.sendall(head.encode() + prefix)
            reply = sock.recv(4096).decode()
            elapsed = time.monotonic() - start
            while "}" not in reply.split("\r\n\r\n", 1)[-1]:  # headers and body may split
                more = sock.recv(4096).decode()
                if not more:
                    break
                reply += more
            closed = sock.recv(4096) == b""  # the rest of the body is not read as a request
        assert reply.startswith("HTTP/1.1 408"), reply[:200]
        assert "not received within the 1 s timeout" in reply
        assert "connection: close" in reply.lower() and closed
        assert 0.9 < elapsed < 5
        assert 'request_failure_total{reason="timeout"} 1.0' in metrics(live)


def test_the_deadline_counts_from_arrival_not_from_the_end_of_the_upload(tmp_path):
    """A body that takes 1.5 s to arrive leaves 0.5 s of a 2 s timeout: with the decoder
    stuck, the 504 comes ~2 s after the first byte, not 2 s after the last."""
    config = tiny_server_config(tmp_path, request_timeout=2.0)
    with LiveServer(config) as live:
        runner = live.state.runtime.decode_worker.runner
        slow, original = threading.Event(), runner.start_jobs

        def stuck(jobs):
            slow.wait(8)
            return original(jobs)

        def body():
            yield b'{"text": "Hi.", '
            time.sleep(1.5)
            yield b'"max_new_tokens": 20, "ignore_eos": true}'

        runner.start_jobs = stuck
        try:
            start = time.monotonic()
            response = httpx.post(
                live.url + "/v1/tts",
                content=body(),
                headers={"content-type": "application/json"},
                timeout=60,
            )
            elapsed = time.monotonic() - start
            assert response.status_code == 504, response.text
            assert elapsed < 2.9  # counted from the body's end it would be >= 3.5 s
        finally:
            slow.set()
            runner.start_jobs = original


def test_a_client_gone_before_its_body_arrived_counts_as_cancelled(tmp_path):
    import socket

    with LiveServer(tiny_server_config(tmp_path)) as live:
        with socket.create_connection(("127.0.0.1", live.port), timeout=10) as sock:
            head = (
                "POST /v1/tts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                "Content-Length: 100\r\n\r\n"
            )
            sock.sendall(head.encode() + b'{"text": ')
            time.sleep(0.3)  # the route is waiting for the rest of the body
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if 'request_failure_total{reason="cancelled"} 1.0' in metrics(live):
                break
            time.sleep(0.1)
        assert 'request_failure_total{reason="cancelled"} 1.0' in metrics(live)


def test_a_decoder_behind_real_time_gives_503_only_with_max_decoder_lag(tmp_path, monkeypatch):
    from fishserve.server.decode_worker import DecodeWorker

    with LiveServer(tiny_server_config(tmp_path, max_decoder_lag=0.5)) as live:
        live.state.runtime.decoder_lag = lambda: 2.0
        response = httpx.post(live.url + "/v1/tts", json={"text": "Hi."}, timeout=60)
        assert response.status_code == 503 and response.headers["retry-after"]
        assert "2.0 s behind real time" in response.text
        live.state.runtime.decoder_lag = lambda: 0.2  # within the bound
        assert httpx.post(live.url + "/v1/tts", json={"text": "Hi."}, timeout=60).status_code == 200
        # what /health and /metrics read
        monkeypatch.setattr(DecodeWorker, "lag_seconds", property(lambda self: 3.0))
        assert httpx.get(live.url + "/health").json()["status"] == "busy"
        assert "fishserve:decoder_lag_seconds 3.0" in metrics(live)
    with LiveServer(tiny_server_config(tmp_path)) as live:  # off by default
        live.state.runtime.decoder_lag = lambda: 100.0
        assert httpx.post(live.url + "/v1/tts", json={"text": "Hi."}, timeout=60).status_code == 200


def test_a_stopped_decoder_thread_makes_the_server_unhealthy(tmp_path):
    with LiveServer(tiny_server_config(tmp_path)) as live:
        assert httpx.get(live.url + "/health").json()["status"] == "ok"
        live.state.runtime.decode_worker.shutdown()  # as if the thread had died
        health = httpx.get(live.url + "/health")
        assert health.status_code == 503 and health.json()["status"] == "unhealthy"


def test_references_are_refused_before_their_encoding_when_the_queue_is_full(tmp_path):
    """Requests encoding their references wait for admission: they count as waiting
    (/health, /metrics) and a request beyond `max_waiting` gets 429 without being encoded."""
    import asyncio
    import base64
    import io

    import numpy as np
    import soundfile as sf

    buffer = io.BytesIO()
    sf.write(
        buffer,
        0.3 * np.sin(2 * np.pi * 220 * np.arange(22050) / 44100),
        44100,
        "PCM_16",
        format="WAV",
    )
    ref = {"audio": base64.b64encode(buffer.getvalue()).decode(), "text": "A tone."}
    body = {"text": "Cloned.", "max_new_tokens": 3, "references": [ref]}
    config = tiny_server_config(tmp_path, max_waiting=2)
    with LiveServer(config) as live:
        runtime, gate, calls = live.state.runtime, threading.Event(), []
        encode = runtime.encode_reference

        async def slow_encode(audio: bytes):
            calls.append(len(audio))
            await asyncio.to_thread(gate.wait, 60)
            return await encode(audio)

        runtime.encode_reference = slow_encode
        results: list[httpx.Response] = []

        def send() -> None:
            results.append(httpx.post(live.url + "/v1/tts", json=body, timeout=120))

        senders = [threading.Thread(target=send) for _ in range(2)]
        for t in senders:
            t.start()
        try:
            for _ in range(400):
                if live.state.encoding == 2:
                    break
                time.sleep(0.02)
            health = httpx.get(live.url + "/health").json()
            assert health["requests"]["waiting"] == 2 and health["status"] == "busy"
            assert "fishserve:num_requests_waiting 2.0" in metrics(live)
            refused = httpx.post(live.url + "/v1/tts", json=body, timeout=60)
            assert refused.status_code == 429 and refused.headers["retry-after"]
            assert "2 requests waiting" in refused.json()["message"]
            assert len(calls) == 2  # the refused request's reference was never encoded
            # Nothing to encode: the engine's own queue is empty, but two requests wait.
            plain = {"text": "No voice.", "max_new_tokens": 3}
            crowded = httpx.post(live.url + "/v1/tts", json=plain, timeout=60)
            assert crowded.status_code == 429, crowded.text
            speech = {"input": "No voice.", "voice": "default", "response_format": "wav"}
            crowded = httpx.post(live.url + "/v1/audio/speech", json=speech, timeout=60)
            assert crowded.status_code == 429, crowded.text
            # An unknown voice is a 404 even now: it never counts as waiting.
            unknown = {"text": "Hi.", "reference_id": "nobody"}
            missing = httpx.post(live.url + "/v1/tts", json=unknown, timeout=60)
            assert missing.status_code == 404, missing.text
        finally:
            gate.set()
            for t in senders:
                t.join(120)
        assert [r.status_code for r in results] == [200, 200]
        assert live.state.encoding == 0
        assert httpx.get(live.url + "/health").json()["requests"]["waiting"] == 0


def test_a_declared_oversized_body_gets_a_413_and_the_connection_is_closed(tmp_path):
    """A 413 answered from Content-Length, before the body: the body would otherwise be read
    as the next request on the connection, which would then hang."""
    import socket

    with LiveServer(tiny_server_config(tmp_path)) as live:
        with socket.create_connection(("127.0.0.1", live.port), timeout=10) as sock:
            head = (
                "POST /v1/tts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                "Content-Length: 41943040\r\n\r\n"
            )
            sock.sendall(head.encode() + b'{"text": "' + b"x" * 100)
            reply = b""
            while chunk := sock.recv(4096):  # until the server closes the connection
                reply += chunk
        text = reply.decode()
        assert text.startswith("HTTP/1.1 413"), text[:200]
        assert "connection: close" in text.lower() and "exceeds the limit" in text


def test_a_request_cut_by_the_shutdown_timeout_gets_a_json_503(tmp_path):
    """uvicorn cancels what still runs when the shutdown timeout is over: a response not yet
    started becomes our 503 with Retry-After, not uvicorn's plain-text 500."""
    import asyncio
    import json
    from types import SimpleNamespace

    from fishserve.server.app import GuardMiddleware

    async def stuck(scope, receive, send):
        await asyncio.sleep(3600)

    refused: list[int] = []
    state = SimpleNamespace(
        config=tiny_server_config(tmp_path), metrics=SimpleNamespace(refused=refused.append)
    )
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def main() -> None:
        scope = {"type": "http", "path": "/v1/tts", "method": "POST", "headers": []}
        task = asyncio.ensure_future(GuardMiddleware(stuck, state)(scope, receive, send))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    start, body = sent[0], sent[1]
    assert start["status"] == 503
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    assert headers["retry-after"] and headers["connection"] == "close"
    assert "shutting down" in json.loads(body["body"])["message"]
    assert refused == [503]


def test_references_are_encoded_on_their_own_bounded_pool(tmp_path):
    """Reference audio is decoded and encoded by `REFERENCE_WORKERS` threads of the runtime,
    not on asyncio's default pool (which parses every request's body)."""
    import io

    import numpy as np
    import soundfile as sf

    from fishserve.server.runtime import REFERENCE_WORKERS

    buffer = io.BytesIO()
    sf.write(buffer, 0.3 * np.sin(np.arange(22050) / 20), 44100, "PCM_16", format="WAV")
    with LiveServer(tiny_server_config(tmp_path)) as live:
        runtime, threads = live.state.runtime, []
        encode = runtime.references.encode

        def recording_encode(audio: bytes):
            threads.append(threading.current_thread().name)
            return encode(audio)

        runtime.references.encode = recording_encode
        files = {"audio": ("ref.wav", buffer.getvalue(), "audio/wav")}
        added = httpx.post(
            live.url + "/v1/references/add", data={"id": "tone"}, files=files, timeout=60
        )
        assert added.status_code == 200, added.text
        assert threads and all(name.startswith("fishserve-reference") for name in threads)
        assert runtime.reference_pool._max_workers == REFERENCE_WORKERS


def test_health_and_metrics_count_waiting_as_admission_does(tmp_path, monkeypatch):
    """/health and the gauge report `Runtime.pending` (with an engine process it adds the
    requests sent since the core's last status), not only the engine's last count: a stalled
    core's status stayed at its last count while requests piled up behind it."""
    with LiveServer(tiny_server_config(tmp_path, max_waiting=16)) as live:
        monkeypatch.setattr(live.state.runtime, "pending", lambda: 7)
        health = httpx.get(live.url + "/health").json()
        assert health["requests"]["waiting"] == 7 and health["status"] == "ok"
        assert "fishserve:num_requests_waiting 7.0" in metrics(live)
