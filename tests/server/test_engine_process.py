"""The engine in its own process (`engine_process: on`): same audio, same errors, same counters
as in-process, and a dead engine process fails requests cleanly instead of hanging them."""

from __future__ import annotations

import os
import shutil
import signal
import time

import httpx
import numpy as np
import pytest
from conftest import TINY_T2S, LiveServer, assert_same_pcm, tiny_server_config

from fishserve.audio.io import AudioDecodeError
from fishserve.audio.references import ReferenceAudioError
from fishserve.models.checkpoint import CheckpointError
from fishserve.server.core_client import estimate_waiting, start_remote_runtime
from fishserve.server.engine_core import portable_exception
from fishserve.server.runtime import uses_engine_process

FIXED = {"format": "pcm", "seed": 3, "ignore_eos": True, "max_new_tokens": 24}
TONE = 0.3 * np.sin(2 * np.pi * 220 * np.arange(22050) / 44100)


def wav(samples: np.ndarray) -> bytes:
    import io

    import soundfile as sf

    buffer = io.BytesIO()
    sf.write(buffer, samples, 44100, format="WAV")
    return buffer.getvalue()


def post(live: LiveServer, path: str, **kwargs) -> httpx.Response:
    return httpx.post(live.url + path, timeout=120, **kwargs)


@pytest.fixture(scope="module", params=["http", "core"])
def remote(tmp_path_factory, request):
    """A live server with an engine core; each stream's pipeline in the HTTP process (relayed)
    or in the core (`stream_pipeline`)."""
    config = tiny_server_config(
        tmp_path_factory.mktemp("core"),
        engine_process="on",
        threads=1,
        max_reference_seconds=2,
        stream_pipeline=request.param,
    )
    with LiveServer(config) as live:
        yield live


def test_auto_means_a_process_only_with_a_gpu(tmp_path):
    assert not uses_engine_process(tiny_server_config(tmp_path))  # device cpu
    assert uses_engine_process(tiny_server_config(tmp_path, engine_process="on"))
    assert not uses_engine_process(tiny_server_config(tmp_path, engine_process=False))


def test_audio_equals_the_in_process_engine(remote, tmp_path):
    body = {"text": "Same audio either way.", **FIXED}
    there = post(remote, "/v1/tts", json=body)
    assert there.status_code == 200, there.text
    with LiveServer(tiny_server_config(tmp_path, threads=1)) as local:
        here = post(local, "/v1/tts", json=body)
    assert len(there.content) == 23 * 256 * 2  # the first frame is no audio
    assert_same_pcm(there.content, here.content)


def test_streaming_and_health_and_metrics_come_from_the_core(remote):
    body = {"text": "Stream me.", **FIXED, "streaming": True}
    with httpx.stream("POST", remote.url + "/v1/tts", json=body, timeout=120) as response:
        streamed = b"".join(response.iter_bytes())
    assert response.status_code == 200 and len(streamed) == 23 * 256 * 2
    time.sleep(0.6)  # the core reports its counters every 0.25 s
    health = httpx.get(remote.url + "/health").json()
    assert health["status"] == "ok" and health["loaded"]
    assert health["kv_cache"]["blocks_total"] == 512 and health["kv_cache"]["dtype"] == "fp32"
    text = httpx.get(remote.url + "/metrics").text
    frames = [line for line in text.splitlines() if line.startswith("fishserve:decoder_frames")]
    assert frames and float(frames[0].split()[-1]) >= 23


@pytest.mark.parametrize(
    ("waiting", "running", "max_num_seqs", "sent", "expected"),
    [
        (0, 0, 8, 40, 32),  # a burst: 8 take the free slots, 32 wait
        (0, 5, 8, 2, 0),  # room for both
        (0, 5, 8, 4, 1),
        (3, 5, 8, 4, 7),  # some wait already: the new ones queue behind them
        (0, 8, 8, 2, 2),  # full
        (0, 0, 0, 3, 3),  # slots unknown: every one counted
        (2, 0, 8, 0, 2),
    ],
)
def test_waiting_is_estimated_from_the_free_slots(waiting, running, max_num_seqs, sent, expected):
    assert estimate_waiting(waiting, running, max_num_seqs, sent) == expected


def test_the_core_reports_its_slots(remote):
    assert remote.state.runtime.info.max_num_seqs == 64  # ServerConfig's default


def test_the_pipeline_runs_where_the_setting_says(remote):
    runtime = remote.state.runtime
    relayed = remote.state.config.stream_pipeline == "http"
    assert (runtime.relay is not None) == relayed == (runtime.info.relay is not None)
    if relayed:
        assert runtime.info.relay.stateful  # the CPU's decoder: its state stays in the core
    health = httpx.get(remote.url + "/health").json()
    assert health["model"]["stream_pipeline"] == remote.state.config.stream_pipeline


def test_voice_cloning_encodes_in_the_core(remote):
    files = {"audio": ("ref.wav", wav(TONE), "audio/wav")}
    added = post(remote, "/v1/references/add", data={"id": "tone", "text": "A tone."}, files=files)
    assert added.status_code == 200, added.text
    body = {"text": "In that voice.", "reference_id": "tone", **FIXED}
    spoken = post(remote, "/v1/tts", json=body)
    assert spoken.status_code == 200 and len(spoken.content) > 0
    silent = {"audio": ("s.wav", wav(np.zeros(22050)), "audio/wav")}
    bad = post(remote, "/v1/references/add", data={"id": "silent", "text": "x"}, files=silent)
    assert bad.status_code == 400 and "silent" in bad.json()["message"]


def test_input_errors_keep_their_status(remote):
    # two segments on the 256-position tiny model: the second one cannot fit (ContextFullError)
    body = {"text": ("x" * 150 + ". ") * 2, "chunk_length": 150, **FIXED, "max_new_tokens": 30}
    too_long = post(remote, "/v1/tts", json=body)
    assert too_long.status_code == 400, too_long.text
    assert "does not fit the model's context" in too_long.json()["message"]
    assert post(remote, "/v1/tts", json={"text": "After an error.", **FIXED}).status_code == 200


def test_client_disconnects_free_the_core_s_kv_blocks(remote):
    body = {"text": "Leave early.", "format": "pcm", "streaming": True}
    body |= {"max_new_tokens": 400, "ignore_eos": True}
    for _ in range(4):
        with httpx.stream("POST", remote.url + "/v1/tts", json=body, timeout=60) as response:
            next(response.iter_bytes())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        health = httpx.get(remote.url + "/health").json()
        if health["requests"]["running"] == 0 and (
            health["kv_cache"]["blocks_free"] == health["kv_cache"]["blocks_total"]
        ):
            break
        time.sleep(0.2)
    assert health["requests"]["running"] == 0
    assert health["kv_cache"]["blocks_free"] == health["kv_cache"]["blocks_total"]


def test_a_load_failure_in_the_core_raises_its_error(tmp_path):
    broken = tmp_path / "checkpoint"
    shutil.copytree(TINY_T2S, broken)
    (broken / "model.pth").write_bytes(b"not a checkpoint")
    config = tiny_server_config(tmp_path, engine_process="on", threads=1, checkpoint=broken)
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        start_remote_runtime(config)


def test_a_dead_core_fails_its_requests_and_is_replaced(tmp_path):
    config = tiny_server_config(tmp_path, engine_process="on", threads=1)
    with LiveServer(config) as live:
        first = live.state.runtime.process
        body = {"text": "Interrupted.", "format": "pcm", "streaming": True}
        body |= {"max_new_tokens": 2000, "ignore_eos": True}
        with httpx.stream("POST", live.url + "/v1/tts", json=body, timeout=60) as response:
            chunks = response.iter_raw()
            next(chunks)
            os.kill(first.pid, signal.SIGKILL)
            with pytest.raises(httpx.HTTPError):  # the stream ends without its last chunk
                for _ in chunks:
                    pass
        seen, deadline = set(), time.monotonic() + 90
        while time.monotonic() < deadline:
            health = httpx.get(live.url + "/health")
            seen.add((health.status_code, health.json()["status"]))
            if health.status_code == 200 and health.json()["loaded"]:
                break
            time.sleep(0.2)
        assert (503, "unhealthy") in seen  # dead or reloading: out of a load balancer's pool
        assert health.status_code == 200, health.text
        assert live.state.runtime.process.pid != first.pid
        again = post(live, "/v1/tts", json={"text": "Anyone there?", **FIXED})
        assert again.status_code == 200 and len(again.content) == 23 * 256 * 2
    assert not first.is_alive()


def test_exceptions_that_cannot_be_pickled_arrive_as_their_base():
    error = ReferenceAudioError("silent", "the reference audio is silent")
    sent = portable_exception(error)
    assert type(sent) is AudioDecodeError and str(sent) == "the reference audio is silent"
    plain = ValueError("bad")
    assert portable_exception(plain) is plain


def test_a_stalled_core_times_requests_out_and_is_reported(tmp_path, monkeypatch):
    import fishserve.server.core_client as core_client

    monkeypatch.setattr(core_client, "TIMEOUT_GRACE_S", 0.5)
    monkeypatch.setattr(core_client, "STALE_S", 1.0)
    monkeypatch.setattr(core_client, "ENCODE_TIMEOUT_S", 1.0)
    config = tiny_server_config(tmp_path, engine_process="on", threads=1, request_timeout=1)
    with LiveServer(config) as live:
        pid = live.state.runtime.process.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            response = post(live, "/v1/tts", json={"text": "Anyone?", **FIXED})
            assert response.status_code == 504, response.text
            assert time.monotonic() - started < 10
            health = httpx.get(live.url + "/health")
            assert health.status_code == 503
            assert "stopped responding" in health.json()["error"]
            assert live.state.runtime.process.pid == pid  # stalled is not dead: not replaced
            started = time.monotonic()  # known stalled: refused at once, not left to wait
            refused = post(live, "/v1/tts", json={"text": "Anyone?", **FIXED})
            assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
            assert "stopped responding" in refused.json()["message"]
            assert time.monotonic() - started < 0.5
            files = {"audio": ("ref.wav", wav(TONE), "audio/wav")}
            started = time.monotonic()  # a voice upload too: not held for the encode timeout
            added = post(live, "/v1/references/add", data={"id": "v", "text": "x"}, files=files)
            assert added.status_code == 503 and added.headers["retry-after"] == "5", added.text
            assert time.monotonic() - started < 0.5
        finally:
            os.kill(pid, signal.SIGCONT)


def watch_until(state, kind: type) -> None:
    """Run `state.watch_engine` until its runtime is a `kind` (at most 5 s)."""
    import asyncio

    async def run() -> None:
        watcher = asyncio.create_task(state.watch_engine(interval=0.05))
        for _ in range(100):
            await asyncio.sleep(0.05)
            if isinstance(state.runtime, kind):
                break
        watcher.cancel()

    asyncio.run(run())


def test_a_dead_core_that_fails_to_stop_is_replaced_all_the_same(tmp_path):
    """An error while stopping the dead core (or taking its totals) is logged, and the new
    one loads: it ended the watcher before, leaving the server without an engine."""
    from fishserve.server.state import ServerState

    class BrokenDeadCore:
        restartable = True

        def needs_restart(self) -> bool:
            return True

        def shutdown(self) -> None:
            raise RuntimeError("the pipe is closed")

    class Healthy:
        restartable = True

        def needs_restart(self) -> bool:
            return False

    state = ServerState(tiny_server_config(tmp_path), lambda config: Healthy(), BrokenDeadCore())

    watch_until(state, Healthy)
    assert isinstance(state.runtime, Healthy)


def test_a_replacement_that_fails_to_load_is_tried_again(tmp_path, monkeypatch):
    import fishserve.server.state as state_module
    from fishserve.server.state import ServerState

    monkeypatch.setattr(state_module, "LOAD_RETRY_S", 0.3)

    class DeadCore:
        restartable = True

        def needs_restart(self) -> bool:
            return True

        def shutdown(self) -> None:
            pass

        def status(self):  # for the metrics of an unload
            from fishserve.engine.engine import EngineStats
            from fishserve.server.runtime import RuntimeStatus

            return RuntimeStatus(EngineStats(0, 0, 0, 0, 0, 0), False, None, False, 0.0, 0, 0)

        def pending(self) -> int:
            return 0

    class Healthy(DeadCore):
        def needs_restart(self) -> bool:
            return False

    builds = []

    def build(config):
        builds.append(1)
        if len(builds) == 1:
            raise RuntimeError("the engine process exited (code -9) while loading the models")
        return Healthy()

    state = ServerState(tiny_server_config(tmp_path), build, DeadCore())

    watch_until(state, Healthy)
    assert len(builds) == 2 and isinstance(state.runtime, Healthy)


def test_the_core_counts_a_request_s_time_from_its_http_arrival(tmp_path):
    """The HTTP process's `time.monotonic()` arrival reaches the core, which measures queue
    time and the timeout from it (one system-wide clock)."""
    import asyncio

    from fishserve.engine.engine import GenerationRequest
    from fishserve.server.pipeline import SynthesisTimeoutError

    runtime = start_remote_runtime(tiny_server_config(tmp_path, engine_process="on", threads=1))

    async def queue_seconds(timeout: float, arrival: float) -> float | None:
        request = GenerationRequest("Late.", max_new_tokens=12, ignore_eos=True)
        async for chunk in runtime.synthesize(request, timeout, arrival):
            return chunk.queue_seconds
        raise AssertionError("no audio")

    try:
        queued = asyncio.run(queue_seconds(60.0, time.monotonic() - 2.0))
        assert queued is not None and queued >= 2.0  # the 2 s before the call count
        with pytest.raises(SynthesisTimeoutError):
            asyncio.run(queue_seconds(5.0, time.monotonic() - 10.0))
    finally:
        runtime.shutdown()


def test_the_core_s_finish_reason_labels_the_success(remote):
    """A request cut at its frame budget (ignore_eos) counts as a "length" success."""

    def successes(reason: str) -> float:
        sample = f'fishserve:request_success_total{{finished_reason="{reason}"}} '
        lines = httpx.get(remote.url + "/metrics").text.splitlines()
        return sum(float(line.split()[-1]) for line in lines if line.startswith(sample))

    before = successes("length"), successes("stop")
    assert post(remote, "/v1/tts", json={"text": "Counted.", **FIXED}).status_code == 200
    assert (successes("length"), successes("stop")) == (before[0] + 1, before[1])


def test_a_relay_without_an_engine_process_is_said_to_do_nothing(tmp_path, caplog):
    from fishserve.server.runtime import build_runtime

    config = tiny_server_config(tmp_path, threads=1, stream_pipeline="http")  # cpu: in-process
    with caplog.at_level("WARNING"):
        runtime = build_runtime(config)
    try:
        assert not runtime.restartable
        assert any("no effect without an engine process" in r.message for r in caplog.records)
    finally:
        runtime.shutdown()
