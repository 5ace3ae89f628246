"""`fishserve serve`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from fishserve.cli import (
    app,
    err_console,
    set_threads,
    user_errors,
)
from fishserve.server.config import ServerConfig, check_model_files


def _setting(name: str, help: str, *decls: str) -> Any:
    """A `serve` option for the setting `name`: its default (from `ServerConfig`) is shown in
    the help; the value passed on is None unless given, so YAML and environment still apply."""
    shown = default_text(ServerConfig.model_fields[name].default)
    return typer.Option(*decls, help=f"{help} \\[default: {shown}]", show_default=False)


def default_text(value: object) -> str:
    """How a setting's default is written in help and the README: on/off, none, or the value."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return "none" if value is None else str(value)


@app.command()
@user_errors
def serve(
    config: Annotated[
        Path | None, typer.Option(help="YAML file of settings (the names of these flags).")
    ] = None,
    checkpoint: Annotated[
        Path | None, _setting("checkpoint", "Official checkpoint folder; none = random weights.")
    ] = None,
    decoder_checkpoint: Annotated[
        Path | None,
        _setting(
            "decoder_checkpoint",
            "Firefly generator weights; none = firefly-gan-vq-fsq-8x1024-21hz-generator.pth "
            "in --checkpoint.",
        ),
    ] = None,
    decoder_config: Annotated[
        Path | None,
        _setting("decoder_config", "Decoder config (official yaml/json); none = released."),
    ] = None,
    load_format: Annotated[
        str | None, _setting("load_format", "auto (files) or dummy (random weights).")
    ] = None,
    dummy_logits: Annotated[
        str | None,
        _setting(
            "dummy_logits",
            "Random weights only: flat (plain init; the sampler's slowest path) or peaked "
            "(trained-model-like slow logits, std 8).",
        ),
    ] = None,
    device: Annotated[str | None, _setting("device", "auto, cpu, cuda, cuda:N.")] = None,
    dtype: Annotated[
        str | None, _setting("dtype", "Weights: auto (bf16 on GPU, fp32 on CPU), fp32, bf16, fp16.")
    ] = None,
    threads: Annotated[
        int | None,
        _setting("threads", "CPU threads of torch; none = one per core (busy machine: 1)."),
    ] = None,
    kv_cache_dtype: Annotated[
        str | None,
        _setting("kv_cache_dtype", "auto (= weights), fp32, bf16, fp16, int8, fp8."),
    ] = None,
    block_size: Annotated[int | None, _setting("block_size", "Positions per KV block.")] = None,
    max_num_seqs: Annotated[
        int | None, _setting("max_num_seqs", "Running requests at most.")
    ] = None,
    max_num_batched_tokens: Annotated[
        int | None, _setting("max_num_batched_tokens", "Positions per engine step at most.")
    ] = None,
    static_prefill_tokens: Annotated[
        int | None,
        _setting(
            "static_prefill_tokens",
            "Prompt positions per step run inside the captured decode step (GPU).",
        ),
    ] = None,
    gpu_memory_budget: Annotated[
        str | None,
        _setting(
            "gpu_memory_budget",
            "Memory for weights, activations, decoder and KV pool: e.g. 6GiB, or a fraction "
            "of the GPU like 0.9; none = 0.9 on GPU, a small KV pool on CPU.",
            "--gpu-memory-budget",
            "--memory-budget",
        ),
    ] = None,
    num_kv_blocks: Annotated[
        int | None, _setting("num_kv_blocks", "Fixed KV pool size (instead of the budget).")
    ] = None,
    enforce_eager: Annotated[
        bool | None,
        _setting("enforce_eager", "No CUDA graphs for the language model or the decoder (slower)."),
    ] = None,
    async_scheduling: Annotated[
        bool | None,
        _setting(
            "async_scheduling",
            "Mainly for GPUs: launch each engine step before the previous one's frames reach "
            "the host (a faster engine and lower RTF; alone, later first audio near the server's "
            "capacity; with --boost-frames, the most real-time streams).",
        ),
    ] = None,
    compile_fast_transformer: Annotated[
        bool | None,
        _setting(
            "compile_fast_transformer",
            "GPU: compile each engine step's fast-transformer half (codebooks and their "
            "sampling) with torch.compile at start-up: fewer kernels per step.",
        ),
    ] = None,
    boost_frames: Annotated[
        int | None,
        _setting(
            "boost_frames",
            "Under load, after every engine step run a step of just the streams with fewer "
            "than this many audio frames so far (their first chunks come sooner); sync or "
            "--async-scheduling; 0 = off.",
        ),
    ] = None,
    boost_min_running: Annotated[
        int | None,
        _setting(
            "boost_min_running",
            "--boost-frames only while at least this many running sequences are past their "
            "boost (at least 1).",
        ),
    ] = None,
    realtime_admission: Annotated[
        float | None,
        _setting(
            "realtime_admission",
            "Admit a new request only while the engine's frame rate serves one more stream at "
            "this many times the audio's frame rate (e.g. 1.15); others wait; 0 = off.",
        ),
    ] = None,
    engine_process: Annotated[
        str | None,
        _setting(
            "engine_process",
            "Run the engine, decoder and reference encoder in their own process: auto (on with "
            "a GPU), on, off.",
        ),
    ] = None,
    stream_pipeline: Annotated[
        str | None,
        _setting(
            "stream_pipeline",
            "With an engine process, where each stream's chunking and deadlines run: core (in "
            "the engine's process) or http (the HTTP process relays frames and chunks).",
        ),
    ] = None,
    gil_switch_interval: Annotated[
        float | None,
        _setting(
            "gil_switch_interval",
            "Seconds a Python thread of the engine's process runs before a waiting thread gets "
            "the GIL (CPython's default: 0.005).",
        ),
    ] = None,
    gil_probe: Annotated[
        bool | None,
        _setting(
            "gil_probe",
            "Measure how long a thread of the engine's process waits for the GIL (metrics "
            "fishserve:gil_wait_seconds_total, fishserve:gil_probe_wakeups_total).",
        ),
    ] = None,
    gc_full_interval: Annotated[
        float | None,
        _setting(
            "gc_full_interval",
            "Seconds between full garbage collections at most: CPython's own are held off and "
            "run when the process is idle or after this long; 0: CPython's automatic ones.",
        ),
    ] = None,
    default_max_new_tokens: Annotated[
        int | None,
        _setting(
            "default_max_new_tokens",
            "Frames per segment when a request does not say; none = 1024, or 64 with random "
            "weights.",
        ),
    ] = None,
    first_chunk_frames: Annotated[
        int | None, _setting("first_chunk_frames", "Frames decoded into the first audio chunk.")
    ] = None,
    first_chunk_deadline: Annotated[
        float | None,
        _setting(
            "first_chunk_deadline",
            "Seconds after arrival by which the first audio chunk goes out with the frames "
            "generated so far (at least half of --first-chunk-frames); none = wait for all.",
        ),
    ] = None,
    chunk_frames: Annotated[
        int | None, _setting("chunk_frames", "Frames per later audio chunk, at most.")
    ] = None,
    chunk_growth: Annotated[
        float | None,
        _setting(
            "chunk_growth",
            "Each later audio chunk is this many times the previous one, up to "
            "--chunk-frames (2: 10, 20, 40, 64 frames).",
        ),
    ] = None,
    early_chunk_margin: Annotated[
        float | None,
        _setting(
            "early_chunk_margin",
            "Seconds before a playing client runs out of audio at which the frames generated "
            "so far go out as a shorter chunk.",
        ),
    ] = None,
    rebuffer_frames: Annotated[
        int | None,
        _setting(
            "rebuffer_frames",
            "While a client playing in real time is out of audio, the least frames of its "
            "stream's early chunks (0 = off).",
        ),
    ] = None,
    max_decode_batch: Annotated[
        int | None, _setting("max_decode_batch", "Audio chunks decoded together at most.")
    ] = None,
    decoder_batch_wait: Annotated[
        float | None,
        _setting(
            "decoder_batch_wait",
            "Seconds a queued audio chunk may wait for others to share its decoder call "
            "(chunks due within 0.15 s never wait); 0 = decode at once.",
        ),
    ] = None,
    decoder_call_overhead: Annotated[
        float | None,
        _setting(
            "decoder_call_overhead",
            "A decoder call's fixed cost in padded job-frames: larger pads more short chunks "
            "into fewer, larger calls.",
        ),
    ] = None,
    decoder_pipeline: Annotated[
        bool | None,
        _setting(
            "decoder_pipeline",
            "Launch the next decoder call while the last one's audio is handed out (and a "
            "full call right behind the running one).",
        ),
    ] = None,
    max_decoder_lag: Annotated[
        float | None,
        _setting(
            "max_decoder_lag",
            "Refuse new requests (503) while the audio decoder is more than this many seconds "
            "behind real time; none = never.",
        ),
    ] = None,
    decoder_compile: Annotated[
        bool | None,
        _setting(
            "decoder_compile",
            "Fuse the PyTorch decoder head with torch.compile (with --decoder-kernels torch; "
            "slow start-up).",
        ),
    ] = None,
    decoder_kernels: Annotated[
        str | None,
        _setting(
            "decoder_kernels",
            "GPU decoder head kernels: auto (triton on CUDA with Triton installed), triton, "
            "or torch (cuDNN).",
        ),
    ] = None,
    gpu_sharing: Annotated[
        str | None,
        _setting(
            "gpu_sharing",
            "How engine steps and decoder calls share the GPU: overlap (at once, on two CUDA "
            "streams) or turns (one decoder call between steps).",
        ),
    ] = None,
    decoder_sms: Annotated[
        int | None,
        _setting(
            "decoder_sms",
            "Run the GPU decoder on this many SMs (CUDA green context), leaving the others to "
            "the engine's steps; none = all SMs.",
        ),
    ] = None,
    engine_sms: Annotated[
        int | None,
        _setting(
            "engine_sms",
            "Reserve this many SMs for the engine: the decoder gets --decoder-sms of the others "
            "(default all); none = no partition. Needs cuda-bindings.",
        ),
    ] = None,
    confine_engine_graphs: Annotated[
        bool | None,
        _setting(
            "confine_engine_graphs",
            "With --engine-sms: run the engine's CUDA graphs on its SMs only too (default: "
            "they may use the decoder's SMs; measured faster).",
        ),
    ] = None,
    max_reference_seconds: Annotated[
        float | None, _setting("max_reference_seconds", "Longest reference audio (s).")
    ] = None,
    host: Annotated[str | None, _setting("host", "Listen address.")] = None,
    port: Annotated[int | None, _setting("port", "Listen port.")] = None,
    api_key: Annotated[
        str | None, _setting("api_key", "Require 'Authorization: Bearer KEY'.")
    ] = None,
    references_dir: Annotated[
        Path | None, _setting("references_dir", "Stored voices folder.")
    ] = None,
    max_waiting: Annotated[int | None, _setting("max_waiting", "Queue bound before 429.")] = None,
    max_text_length: Annotated[
        int | None, _setting("max_text_length", "Longest text, in characters.")
    ] = None,
    max_body_bytes: Annotated[
        int | None, _setting("max_body_bytes", "Largest request body (bytes; 413 beyond).")
    ] = None,
    request_timeout: Annotated[
        float | None, _setting("request_timeout", "Seconds a request may take, queued or running.")
    ] = None,
    max_connections: Annotated[
        int | None,
        _setting("max_connections", "Open connections and running requests at most (503 beyond)."),
    ] = None,
    shutdown_timeout: Annotated[
        float | None,
        _setting("shutdown_timeout", "Seconds a stopping server waits for open requests."),
    ] = None,
    lazy_load: Annotated[
        bool | None, _setting("lazy_load", "Load the models on the first request.")
    ] = None,
    idle_unload_seconds: Annotated[
        float | None,
        _setting("idle_unload_seconds", "Unload the models after this idle time (0 = never)."),
    ] = None,
) -> None:
    """Run the HTTP server (Fish /v1/tts, OpenAI /v1/audio/speech, voices, health, metrics).

    Every flag is also a YAML key (--config) and a FISHSERVE_<NAME> environment variable;
    flags win over the environment, which wins over the file.
    """
    overrides = {k: v for k, v in locals().items() if k != "config"}
    settings = ServerConfig.load(config, overrides)
    check_model_files(settings)  # a wrong path fails before PyTorch is imported
    import uvicorn

    from fishserve.server.app import check_port, create_app
    from fishserve.server.http_protocol import (
        install_accept_error_filter,
        raise_open_file_limit,
        uvicorn_options,
    )
    from fishserve.server.runtime import build_runtime, check_settings
    from fishserve.synthesis import RANDOM_WEIGHTS_WARNING

    check_settings(settings)
    check_port(settings.host, settings.port)
    set_threads(settings.threads)
    if settings.random_weights:
        err_console.print(RANDOM_WEIGHTS_WARNING, soft_wrap=True)
    runtime = None
    if not settings.lazy_load:
        logging.getLogger(__name__).info("loading models")
        runtime = _build_or_explain(build_runtime, settings)
    app_ = create_app(settings, build_runtime, runtime)
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()  # -v/-q
    install_accept_error_filter()
    raise_open_file_limit(settings.max_connections)
    # log_config=None: uvicorn's lines go through our handler, with timestamps like ours
    uvicorn.run(
        app_,
        host=settings.host,
        port=settings.port,
        log_level=level,
        log_config=None,
        timeout_graceful_shutdown=settings.shutdown_timeout,
        **uvicorn_options(settings.max_connections),  # slow or silent connections are bounded
    )


def _build_or_explain(build: Callable[[ServerConfig], Any], settings: ServerConfig) -> Any:
    """`build(settings)`, with an allocation that cannot succeed (e.g. --num-kv-blocks beyond
    the machine's memory) reported as one line (a ValueError: exit code 2), not a traceback.

    Raises:
        ValueError: the models, KV cache or workspaces do not fit in memory.
    """
    try:
        return build(settings)
    except (MemoryError, RuntimeError) as exc:  # torch.OutOfMemoryError is a RuntimeError
        if not isinstance(exc, MemoryError) and "allocate" not in str(exc):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(
            f"the models and KV cache do not fit in memory ({first}): lower --num-kv-blocks, "
            "--max-num-seqs or --gpu-memory-budget"
        ) from exc
