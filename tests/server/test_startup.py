"""`fishserve serve` start-up: one-line errors before anything loads, the runtime built before
the server listens, and a lazily loaded model that fails to load."""

from __future__ import annotations

import logging
import socket

import httpx
import pytest
import torch
import uvicorn
from conftest import TINY_DECODER, TINY_T2S, LiveServer, tiny_server_config
from fastapi.testclient import TestClient
from typer.testing import CliRunner

import fishserve.server.app  # noqa: F401  (binds create_app's default build before tests patch it)
import fishserve.server.runtime as runtime_module
from fishserve.cli import app

TINY = [
    "--checkpoint",
    str(TINY_T2S),
    "--decoder-checkpoint",
    str(TINY_DECODER / "generator.pth"),
    "--decoder-config",
    str(TINY_DECODER / "config.json"),
    "--device",
    "cpu",
    "--port",
    "0",  # any free port: 8080 may be taken
    "--num-kv-blocks",
    "64",
]


@pytest.fixture
def serve(tmp_path, monkeypatch):
    """Run `fishserve serve ARGS` in tmp_path; uvicorn.run must not be reached."""
    monkeypatch.chdir(tmp_path)

    def never(*args, **kwargs):
        raise AssertionError("the server started despite the error")

    monkeypatch.setattr(uvicorn, "run", never)
    return lambda *args: CliRunner().invoke(app, ["serve", *args])


@pytest.fixture
def busy_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


CUDA_ERROR = pytest.param(
    ["--device", "cuda"],
    "CUDA is not available",
    marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present"),
)
TRITON_ON_CPU = pytest.param(
    [*TINY, "--device", "cpu", "--decoder-kernels", "triton"],
    "decoder kernels 'triton' need a CUDA device of compute capability 8.0+ and Triton "
    "(the device is cpu)",
)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--checkpoint", "/nonexistent"], "checkpoint folder not found: /nonexistent"),
        (
            ["--checkpoint", str(TINY_T2S / "model.pth")],
            f"is a file: pass the folder that holds config.json, model.pth and "
            f"tokenizer.tiktoken ({TINY_T2S})",
        ),
        (["--decoder-checkpoint", "/nonexistent.pth"], "decoder_checkpoint file not found"),
        (TINY[:2], "no decoder weights"),
        CUDA_ERROR,
        ([*TINY, "--gpu-memory-budget", "lots"], "not a memory size: 'lots'"),
        ([*TINY, "--gpu-memory-budget", "0.5"], "is a fraction of GPU memory"),
        ([*TINY, "--num-kv-blocks", "0"], "num_kv_blocks = 0 (from --num-kv-blocks)"),
        ([*TINY, "--load-format", "weird"], "load_format = 'weird' (from --load-format)"),
        ([*TINY, "--decoder-kernels", "cudnn"], "decoder_kernels = 'cudnn'"),
        ([*TINY, "--dummy-logits", "peaked"], "dummy_logits applies to random weights only"),
        TRITON_ON_CPU,
        (
            [*TINY, "--device", "cpu", "--decoder-sms", "8"],
            "decoder_sms needs a CUDA device, but the device is cpu",
        ),
        ([*TINY, "--decoder-sms", "0"], "decoder_sms = 0 (from --decoder-sms)"),
        (
            [*TINY, "--device", "cpu", "--engine-sms", "56"],
            "engine_sms needs a CUDA device, but the device is cpu",
        ),
        ([*TINY, "--engine-sms", "0"], "engine_sms = 0 (from --engine-sms)"),
        ([*TINY, "--threads", "100000"], "threads = 100000 (from --threads)"),
        ([*TINY, "--confine-engine-graphs"], "confine_engine_graphs needs engine_sms"),
        (
            [*TINY, "--engine-sms", "56", "--confine-engine-graphs", "--enforce-eager"],
            "confine_engine_graphs does nothing with enforce_eager",
        ),
        (
            [*TINY, "--async-scheduling", "--gpu-sharing", "turns"],
            "async_scheduling needs gpu_sharing overlap",
        ),
        (
            [*TINY, "--boost-frames", "32", "--boost-min-running", "-1"],
            "boost_min_running = -1 (from --boost-min-running)",
        ),
        ([*TINY, "--boost-frames", "-1"], "boost_frames = -1 (from --boost-frames)"),
        (
            [*TINY, "--references-dir", str(TINY_T2S / "config.json")],
            "references_dir is not a folder",
        ),
    ],
)
def test_bad_settings_give_one_line_and_exit_2(serve, args, message, monkeypatch):
    monkeypatch.setattr(runtime_module, "build_runtime", lambda config: pytest.fail("loaded"))
    result = serve(*args)
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error:") and message in result.output, result.output
    assert "Traceback" not in result.output and "pydantic.dev" not in result.output


def test_a_kv_pool_beyond_memory_is_one_line(serve, monkeypatch):
    """--num-kv-blocks 1000000000 asked the CPU allocator for 4 TB: a traceback before."""

    def build(config):
        raise RuntimeError("[enforce fail] DefaultCPUAllocator: can't allocate memory: you "
                           "tried to allocate 4096000004096 bytes. Error code 12")  # fmt: skip

    monkeypatch.setattr(runtime_module, "build_runtime", build)
    result = serve(*TINY, "--num-kv-blocks", "1000000000")
    assert result.exit_code == 2, result.output
    assert "do not fit in memory" in result.output and "lower --num-kv-blocks" in result.output
    assert "Traceback" not in result.output


def test_port_in_use_is_found_before_the_models_load(serve, busy_port, monkeypatch):
    monkeypatch.setattr(runtime_module, "build_runtime", lambda config: pytest.fail("loaded"))
    result = serve(*TINY, "--port", str(busy_port))
    assert result.exit_code == 2, result.output
    assert f"error: cannot listen on 127.0.0.1:{busy_port}" in result.output
    assert "another server is running there" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_budget_too_small_for_the_models(serve):
    result = serve(*TINY[:-2], "--gpu-memory-budget", "1MiB")
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: memory budget") and "too small" in result.output


def test_models_are_built_before_the_server_listens(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    events: list[str] = []
    build = runtime_module.build_runtime

    def counting_build(config):
        events.append("build")
        return build(config)

    def run(app_, host, port, **kwargs):
        events.append("run")
        assert kwargs["timeout_graceful_shutdown"] == 12.5  # --shutdown-timeout
        with TestClient(app_) as client:  # runs the lifespan: takes the built runtime
            health = client.get("/health").json()
        assert health["loaded"] and health["model"]["load_format"] == "dummy"
        assert health["model"]["decoder_kernels"] == "torch"  # the CPU's head
        assert health["model"]["engine_sms"] is None and health["model"]["decoder_sms"] is None
        assert health["model"]["confine_engine_graphs"] is False

    monkeypatch.setattr(runtime_module, "build_runtime", counting_build)
    monkeypatch.setattr(uvicorn, "run", run)
    try:
        result = CliRunner().invoke(
            app,
            [
                "serve",
                *TINY,
                "--load-format",
                "dummy",
                "--threads",
                "2",
                "--port",
                "0",
                "--shutdown-timeout",
                "12.5",
            ],
        )
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)  # conftest's setting
    assert result.exit_code == 0, result.output
    assert events == ["build", "run"]  # built once, before the server started
    assert result.output.count("RANDOM weights") == 1


def test_enforce_eager_and_static_prefill_reach_the_engine(tmp_path):
    config = tiny_server_config(
        tmp_path, enforce_eager=True, num_kv_blocks=16, static_prefill_tokens=7
    )
    runtime = runtime_module.build_runtime(config)
    try:
        assert runtime.engine.engine.config.enforce_eager is True
        assert runtime.engine.engine.config.static_prefill_tokens == 7
        assert runtime.engine.engine.runner.max_rows == config.max_num_seqs + 7
    finally:
        runtime.shutdown()


@pytest.mark.parametrize(("frames", "warned"), [(24, False), (10, True)])
def test_boost_settings_reach_the_engine(tmp_path, caplog, frames, warned):
    config = tiny_server_config(tmp_path, boost_frames=frames, boost_min_running=100)
    with caplog.at_level(logging.WARNING, logger=runtime_module.log.name):
        runtime = runtime_module.build_runtime(config)
    try:
        engine = runtime.engine.engine
        assert (engine.config.boost_frames, engine.config.boost_min_running) == (frames, 100)
        assert ("ends with the first chunk" in caplog.text) is warned
    finally:
        runtime.shutdown()


def test_async_scheduling_reaches_the_engine_with_its_overlapped_path(tmp_path):
    runtime = runtime_module.build_runtime(tiny_server_config(tmp_path, async_scheduling=True))
    try:
        engine = runtime.engine.engine
        assert engine.config.async_scheduling is True
        assert engine.runner.static_decode  # on the CPU too: steps overlap, not fall back
    finally:
        runtime.shutdown()


def test_the_cpu_runtime_decodes_streams_statefully(tmp_path):
    runtime = runtime_module.build_runtime(tiny_server_config(tmp_path))
    try:
        assert runtime.stateful_decoder  # eager CPU calls: no frame decoded twice
    finally:
        runtime.shutdown()


@pytest.mark.parametrize("on", [True, False])
def test_compile_fast_transformer_reaches_the_engine(tmp_path, on):
    config = tiny_server_config(tmp_path, compile_fast_transformer=on)
    runtime = runtime_module.build_runtime(config)
    try:
        assert runtime.engine.engine.config.compile_fast_transformer is on
        assert runtime.engine.engine.runner.compile_codes is on
    finally:
        runtime.shutdown()


def test_lazy_load_of_a_broken_checkpoint_is_reported(tmp_path):
    config = tiny_server_config(tmp_path, checkpoint=tmp_path / "missing", lazy_load=True)
    with LiveServer(config) as live:
        assert httpx.get(live.url + "/health").json()["status"] == "ok"  # not loaded yet
        response = httpx.post(live.url + "/v1/tts", json={"text": "Hi."}, timeout=60)
        assert response.status_code == 503, response.text
        message = response.json()["message"]
        assert message.startswith("the models failed to load: checkpoint folder not found")
        health = httpx.get(live.url + "/health")
        assert health.status_code == 503
        assert health.json()["status"] == "unhealthy"
        assert "checkpoint folder not found" in health.json()["error"]


def test_requests_right_after_a_failed_load_do_not_load_again(tmp_path, monkeypatch):
    calls = []

    def failing_build(config):
        calls.append(1)
        raise FileNotFoundError("checkpoint folder not found: nowhere")

    from fishserve.server.state import ModelLoadError, ServerState

    state = ServerState(tiny_server_config(tmp_path, lazy_load=True), failing_build)

    async def three_requests() -> list[ModelLoadError]:
        errors = []
        for _ in range(3):
            with pytest.raises(ModelLoadError) as info:
                await state.load()
            errors.append(info.value)
        return errors

    import asyncio

    from fishserve.server.errors import response_for

    errors = asyncio.run(three_requests())
    messages = [str(e) for e in errors]
    assert len(calls) == 1  # the other two failed at once, with the same reason
    assert all("checkpoint folder not found" in m for m in messages)
    wait = messages[1].rsplit("next try in ", 1)[1].split(" s")[0]
    assert response_for(errors[1]).headers["retry-after"] == wait  # the header says the same


@pytest.mark.parametrize("pipeline", [True, False])
def test_decoder_pipeline_and_chunk_growth_reach_the_decoder(tmp_path, pipeline):
    config = tiny_server_config(tmp_path, decoder_pipeline=pipeline, chunk_growth=1.5)
    runtime = runtime_module.build_runtime(config)
    try:
        worker = runtime.decode_worker
        # pipelined only where calls run asynchronously (CUDA); the CPU decodes in start_jobs
        assert worker.depth == (2 if pipeline and worker.runner.launches_async else 1)
        assert worker.runner.launches_async == torch.cuda.is_available()
        assert runtime.chunk_policy.growth == 1.5
        assert runtime.chunk_policy.next_chunk_frames(10) == 15
    finally:
        runtime.shutdown()


def test_gil_switch_interval_is_set_in_the_runtime_process(tmp_path):
    import sys

    before = sys.getswitchinterval()
    runtime = runtime_module.build_runtime(tiny_server_config(tmp_path, gil_switch_interval=0.002))
    try:
        assert sys.getswitchinterval() == pytest.approx(0.002)
    finally:
        runtime.shutdown()
        sys.setswitchinterval(before)


@pytest.mark.parametrize("bad", [0.0, -1e-3, 0.5, float("nan")])
def test_gil_switch_interval_out_of_range_is_refused(tmp_path, bad):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="gil_switch_interval"):
        tiny_server_config(tmp_path, gil_switch_interval=bad)


def test_gil_switch_interval_refuses_yaml_on_off(tmp_path):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="give a number"):
        tiny_server_config(tmp_path, gil_switch_interval=True)


@pytest.mark.parametrize("probe", [True, False])
def test_the_gil_probe_reports_through_the_runtime_status(tmp_path, probe):
    import time

    runtime = runtime_module.build_runtime(tiny_server_config(tmp_path, gil_probe=probe))
    try:
        time.sleep(0.1)
        status = runtime.status()
        assert (status.gil_wakeups > 0) == probe
        assert status.gil_wait_seconds >= 0.0
    finally:
        runtime.shutdown()
