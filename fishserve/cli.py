"""The `fishserve` command line: synth, encode, decode, serve, bench, eval.

Every command turns expected failures (missing files, bad shapes, bad values, a port in use)
into one red line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from fishserve import __version__
from fishserve.errors import USER_ERRORS
from fishserve.server.config import ServerConfig

app = typer.Typer(
    name="fishserve",
    help="Serve and run the Fish Speech 1.5 text-to-speech model.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err_console = Console(stderr=True)
F = TypeVar("F", bound=Callable[..., None])

DeviceOpt = Annotated[str, typer.Option(help="Torch device: auto, cpu, cuda, cuda:N.")]
DtypeOpt = Annotated[
    str, typer.Option(help="Weight dtype: auto (bf16 on GPU, fp32 on CPU), fp32, bf16, fp16.")
]
DecoderDtypeOpt = Annotated[
    str,
    typer.Option(
        "--dtype", help="Decoder weight dtype: auto (bf16 on GPU, fp32 on CPU), fp32, bf16, fp16."
    ),
]
DecoderCkptOpt = Annotated[
    Path | None,
    typer.Option(
        "--decoder-checkpoint",
        help="Firefly generator weights (firefly-gan-vq-fsq-8x1024-21hz-generator.pth). "
        "Default: the file of that name inside --checkpoint.",
    ),
]
RequiredDecoderCkptOpt = Annotated[
    Path,
    typer.Option(
        "--decoder-checkpoint",
        help="Firefly generator weights: firefly-gan-vq-fsq-8x1024-21hz-generator.pth of the "
        "checkpoint folder (e.g. checkpoints/fish-speech-1.5/).",
    ),
]
DecoderCfgOpt = Annotated[
    Path | None,
    typer.Option(
        "--decoder-config", help="Decoder config (official yaml/json); default: released."
    ),
]
ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="CPU threads of torch (torch.set_num_threads); default: one per core. On a busy "
        "machine --threads 1 can be several times faster.",
    ),
]
AUDIO_OUTPUT_HELP = (
    "Output audio file; its extension picks the format: .wav (16-bit), .flac, .mp3, "
    ".ogg/.opus (Opus, 48 kHz) or .npy (float32 samples at 44.1 kHz)."
)


def user_errors(func: F) -> F:
    """Run a command, turning expected errors into one clear line and exit code 2."""

    @functools.wraps(func)
    def wrapper(*args: object, **kwargs: object) -> None:
        try:
            func(*args, **kwargs)
        except USER_ERRORS as exc:
            message = escape(str(exc))
            err_console.print(
                f"[bold red]error:[/] {message}", highlight=False, markup=True, soft_wrap=True
            )
            raise typer.Exit(code=2) from None

    return wrapper  # type: ignore[return-value]


def set_threads(threads: int | None) -> None:
    """`torch.set_num_threads(threads)` unless None (torch's default: one per core)."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def _print_version(value: bool) -> None:
    """`--version`: print the version and stop."""
    if value:
        print(f"fishserve {__version__}")
        raise typer.Exit()


def _top_p(value: float) -> float:
    """Refuse a `--top-p` outside (0, 1] (0 would keep no token)."""
    if not 0.0 < value <= 1.0:
        raise typer.BadParameter(f"must be in (0, 1], got {value}")
    return value


TopPOpt = Annotated[float, typer.Option(callback=_top_p, help="Nucleus sampling mass, in (0, 1].")]


@app.callback()
def _setup(
    verbose: Annotated[
        bool | None,
        typer.Option(
            "--verbose/--quiet",
            "-v/-q",
            show_default=False,
            help="Debug logging, or warnings and errors only. \\[default: info logging]",
        ),
    ] = None,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            show_default=False,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    """Options before the command: log level and version."""
    levels = {True: logging.DEBUG, False: logging.WARNING, None: logging.INFO}
    logging.basicConfig(
        level=levels[verbose], format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


@app.command()
@user_errors
def synth(
    text: Annotated[str, typer.Option(help="Text to speak.")],
    output: Annotated[Path, typer.Option(help=AUDIO_OUTPUT_HELP)],
    checkpoint: Annotated[
        Path | None,
        typer.Option(
            help="Official checkpoint folder (config.json, model.pth, "
            "tokenizer.tiktoken). Omit to use random weights (noise, for testing)."
        ),
    ] = None,
    decoder_checkpoint: DecoderCkptOpt = None,
    decoder_config: DecoderCfgOpt = None,
    load_format: Annotated[
        str, typer.Option(help="auto (files) or dummy (full-size random weights).")
    ] = "auto",
    reference_audio: Annotated[
        Path | None, typer.Option(help="Reference voice audio (wav, flac, mp3, ogg, m4a).")
    ] = None,
    reference_codes: Annotated[
        Path | None, typer.Option(help="Reference voice codes .npy (num_codebooks, T).")
    ] = None,
    reference_text: Annotated[str, typer.Option(help="Transcript of the reference.")] = "",
    chunk_length: Annotated[int, typer.Option(help="Segment size in UTF-8 bytes.")] = 100,
    max_new_tokens: Annotated[
        int | None,
        typer.Option(
            help="Frames per segment: >= 2 (the first frame is never audio), or 0 = until the "
            "context is full. Default 1024, or 64 with random weights."
        ),
    ] = None,
    max_length: Annotated[int, typer.Option(help="History window budget (positions).")] = 2048,
    top_p: TopPOpt = 0.7,
    temperature: Annotated[
        float, typer.Option(min=0.0, help="Sampling temperature; 0 = greedy (as in the API).")
    ] = 0.7,
    repetition_penalty: Annotated[
        float, typer.Option(help="Penalty on codes of the last 16 frames; 1.0 = none.")
    ] = 1.2,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 42,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    threads: ThreadsOpt = None,
    codes_output: Annotated[
        Path | None, typer.Option(help="Also write the codes (num_codebooks, frames) as .npy.")
    ] = None,
    kv_cache_dtype: Annotated[
        str, typer.Option(help="KV cache: auto (= weights), fp32, bf16, fp16, int8, fp8.")
    ] = "auto",
    block_size: Annotated[int, typer.Option(min=1, help="Positions per KV block.")] = 16,
    max_num_seqs: Annotated[int, typer.Option(min=1, help="Engine batch cap.")] = 8,
    reference_loop: Annotated[
        bool, typer.Option(help="Use the simple batch-1 loop instead of the engine.")
    ] = False,
) -> None:
    """Synthesize speech from text into an audio file (wav, flac, mp3, ogg/opus)."""
    from fishserve.synthesis import SynthesisOptions, run_synth

    set_threads(threads)
    run_synth(
        SynthesisOptions(
            text=text,
            output=output,
            checkpoint=checkpoint,
            decoder_checkpoint=decoder_checkpoint,
            decoder_config=decoder_config,
            load_format=load_format,
            reference_audio=reference_audio,
            reference_codes=reference_codes,
            reference_text=reference_text,
            chunk_length=chunk_length,
            max_new_tokens=max_new_tokens,
            max_length=max_length,
            top_p=top_p,
            temperature=temperature,
            repetition_penalty=repetition_penalty,
            seed=seed,
            device=device,
            dtype=dtype,
            codes_output=codes_output,
            reference_loop=reference_loop,
            kv_cache_dtype=kv_cache_dtype,
            block_size=block_size,
            max_num_seqs=max_num_seqs,
        ),
        console=err_console,
    )


@app.command()
@user_errors
def encode(
    audio: Annotated[Path, typer.Option(help="Audio file (any container) or float .npy.")],
    output: Annotated[Path, typer.Option(help="Output codes .npy (num_codebooks, T) int.")],
    decoder_checkpoint: RequiredDecoderCkptOpt,
    decoder_config: DecoderCfgOpt = None,
    device: DeviceOpt = "auto",
    dtype: DecoderDtypeOpt = "auto",
    threads: ThreadsOpt = None,
) -> None:
    """Encode audio into Firefly codes (for reference voices)."""
    from fishserve.synthesis import run_encode

    set_threads(threads)
    run_encode(audio, output, decoder_checkpoint, decoder_config, device, err_console, dtype)


@app.command()
@user_errors
def decode(
    codes: Annotated[Path, typer.Option(help="Codes .npy (num_codebooks, T) int.")],
    output: Annotated[Path, typer.Option(help=AUDIO_OUTPUT_HELP)],
    decoder_checkpoint: RequiredDecoderCkptOpt,
    decoder_config: DecoderCfgOpt = None,
    device: DeviceOpt = "auto",
    dtype: DecoderDtypeOpt = "auto",
    threads: ThreadsOpt = None,
) -> None:
    """Decode Firefly codes into 44.1 kHz audio (wav, flac, mp3, ogg/opus or .npy)."""
    from fishserve.synthesis import run_decode

    set_threads(threads)
    run_decode(codes, output, decoder_checkpoint, decoder_config, device, err_console, dtype)


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
        bool | None, _setting("enforce_eager", "No CUDA graphs (slower decoding on GPU).")
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
    chunk_frames: Annotated[
        int | None, _setting("chunk_frames", "Frames per later audio chunk.")
    ] = None,
    max_decode_batch: Annotated[
        int | None, _setting("max_decode_batch", "Audio chunks decoded together at most.")
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
    import uvicorn

    from fishserve.server.app import check_port, create_app
    from fishserve.server.runtime import build_runtime, check_settings
    from fishserve.synthesis import RANDOM_WEIGHTS_WARNING

    settings = ServerConfig.load(config, overrides)
    check_settings(settings)
    check_port(settings.host, settings.port)
    set_threads(settings.threads)
    if settings.random_weights:
        err_console.print(RANDOM_WEIGHTS_WARNING, soft_wrap=True)
    runtime = None
    if not settings.lazy_load:
        logging.getLogger(__name__).info("loading models")
        runtime = build_runtime(settings)
    app_ = create_app(settings, build_runtime, runtime)
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()  # -v/-q
    uvicorn.run(app_, host=settings.host, port=settings.port, log_level=level)


@app.command()
@user_errors
def bench(
    url: Annotated[str, typer.Option(help="Server base URL.")] = "http://127.0.0.1:8080",
    api: Annotated[
        str, typer.Option(help="fish (POST /v1/tts) or openai (POST /v1/audio/speech).")
    ] = "fish",
    mode: Annotated[
        str, typer.Option(help="concurrency (closed-loop sweep) or poisson (arrival rates).")
    ] = "concurrency",
    concurrency: Annotated[str, typer.Option(help="Concurrency levels.")] = "1,4,16,64,256",
    rate: Annotated[str, typer.Option(help="Poisson arrival rates, requests/s.")] = "0.5,1,2,4",
    num_requests: Annotated[
        int | None,
        typer.Option(min=1, help="Requests per level (default max(16, 4 x concurrency); 64)."),
    ] = None,
    duration: Annotated[
        float, typer.Option(min=0.1, help="Per level: start no request after this (s).")
    ] = 180.0,
    warmup: Annotated[int, typer.Option(min=0, help="Unmeasured requests first.")] = 2,
    workload: Annotated[
        str, typer.Option(help="builtin, or a .txt (one text a line) / .jsonl file.")
    ] = "builtin",
    lengths: Annotated[str, typer.Option(help="Built-in lengths.")] = "short,medium,long",
    languages: Annotated[str, typer.Option(help="Built-in languages.")] = "en,zh",
    reference_audio: Annotated[
        Path | None, typer.Option(help="Inline reference voice (Fish API).")
    ] = None,
    reference_text: Annotated[str, typer.Option(help="Its transcript.")] = "",
    reference_id: Annotated[
        str | None, typer.Option(help="Stored voice (Fish reference_id / OpenAI voice).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of request 0 (request i: seed + i).")] = 42,
    max_new_tokens: Annotated[
        int | None, typer.Option(min=1, help="Frames per segment cap (Fish API).")
    ] = None,
    ignore_eos: Annotated[
        bool, typer.Option(help="Generate exactly --max-new-tokens frames (fishserve).")
    ] = False,
    chunk_length: Annotated[int, typer.Option(min=100, max=300)] = 200,
    audio_format: Annotated[
        str, typer.Option("--format", help="pcm (s16le) or wav; audio is counted exactly.")
    ] = "pcm",
    streaming: Annotated[bool, typer.Option(help="Fish `streaming` field.")] = True,
    model: Annotated[str, typer.Option(help="OpenAI `model` field.")] = "fish-speech-1.5",
    extra_body: Annotated[
        str | None, typer.Option(help="JSON object merged into every request body.")
    ] = None,
    api_key: Annotated[str | None, typer.Option(help="Bearer token.")] = None,
    timeout: Annotated[float, typer.Option(min=1, help="Per-request timeout (s).")] = 600.0,
    sample_rate: Annotated[
        int, typer.Option(help="PCM rate (Hz) when the server sends no X-Sample-Rate.")
    ] = 44100,
    frame_rate: Annotated[
        float, typer.Option(help="Audio frames per second, for frames/s (44100/2048).")
    ] = 44100 / 2048,
    max_inflight: Annotated[int, typer.Option(min=1, help="Poisson: open requests cap.")] = 1024,
    memory_source: Annotated[
        str, typer.Option(help="auto, health, nvml, nvidia-smi or none.")
    ] = "auto",
    device: Annotated[
        str,
        typer.Option(
            help="GPU to poll via NVML/nvidia-smi if /v1/health has no memory: "
            "cuda, cuda:N, or cpu (none)."
        ),
    ] = "cpu",
    poll_interval: Annotated[float, typer.Option(min=0.05, help="Memory poll period (s).")] = 0.5,
    label: Annotated[str, typer.Option(help="Title of the report.")] = "",
    output_dir: Annotated[Path, typer.Option(help="Where reports go.")] = Path("bench_out"),
) -> None:
    """Load-test a running TTS server; write bench.json, bench.md and PNG plots."""
    from fishserve.bench.options import bench_options
    from fishserve.bench.run import run_bench

    options = bench_options(
        url=url,
        api=api,
        mode=mode,
        concurrency=concurrency,
        rate=rate,
        workload=workload,
        lengths=lengths,
        languages=languages,
        reference_audio=reference_audio,
        reference_text=reference_text,
        reference_id=reference_id,
        extra_body=extra_body,
        memory_source=memory_source,
        device=device,
        seed=seed,
        max_new_tokens=max_new_tokens,
        ignore_eos=ignore_eos,
        chunk_length=chunk_length,
        audio_format=audio_format,
        streaming=streaming,
        model=model,
        num_requests=num_requests,
        duration_s=duration,
        warmup=warmup,
        timeout_s=timeout,
        sample_rate=sample_rate,
        frame_rate=frame_rate,
        max_inflight=max_inflight,
        api_key=api_key,
        poll_interval_s=poll_interval,
        label=label,
        output_dir=output_dir,
    )
    run_bench(options, err_console)


@app.command(name="eval")
@user_errors
def eval_configs(
    checkpoint: Annotated[Path | None, typer.Option(help="Official checkpoint folder.")] = None,
    load_format: Annotated[
        str, typer.Option(help="auto (files) or dummy (full-size random weights).")
    ] = "auto",
    decoder_checkpoint: DecoderCkptOpt = None,
    decoder_config: DecoderCfgOpt = None,
    device: DeviceOpt = "auto",
    configs: Annotated[
        str,
        typer.Option(
            help="WEIGHTS/KV list, e.g. bf16/int8,int8wo/bf16 (weights fp32|bf16|fp16|int8wo, "
            "KV fp32|bf16|fp16|int8|fp8, optional +noise=X); all = the full grid."
        ),
    ] = "all",
    reference: Annotated[str, typer.Option(help="Configuration compared against.")] = "fp32/fp32",
    short_seconds: Annotated[float, typer.Option(min=0.01, help="Short request audio (s).")] = 2.0,
    long_seconds: Annotated[float, typer.Option(min=0.01, help="Long request audio (s).")] = 30.0,
    short_text: Annotated[str | None, typer.Option(help="Text of the short request.")] = None,
    long_text: Annotated[str | None, typer.Option(help="Text of the long request.")] = None,
    seed: Annotated[int, typer.Option(help="Sampling seed of both requests.")] = 42,
    temperature: Annotated[float, typer.Option()] = 0.7,
    top_p: TopPOpt = 0.7,
    repetition_penalty: Annotated[float, typer.Option()] = 1.2,
    block_size: Annotated[int, typer.Option(min=1, help="Positions per KV block.")] = 16,
    kv_positions: Annotated[
        int | None, typer.Option(min=1, help="KV pool size in positions (default max_seq_len).")
    ] = None,
    output_dir: Annotated[Path, typer.Option(help="Where reports go.")] = Path("eval_out"),
) -> None:
    """Compare weight/KV dtypes: memory, ms/frame, fidelity vs fp32, MCD; write eval.md/json/png."""
    from fishserve.eval.options import eval_options
    from fishserve.eval.run import DEFAULT_LONG_TEXT, DEFAULT_SHORT_TEXT, run_eval

    options = eval_options(
        checkpoint=checkpoint,
        load_format=load_format,
        decoder_checkpoint=decoder_checkpoint,
        decoder_config=decoder_config,
        configs=configs,
        reference=reference,
        block_size=block_size,
        kv_positions=kv_positions,
        temperature=temperature,
        top_p=top_p,
        repetition_penalty=repetition_penalty,
        device=device,
        short_text=short_text or DEFAULT_SHORT_TEXT,
        long_text=long_text or DEFAULT_LONG_TEXT,
        short_seconds=short_seconds,
        long_seconds=long_seconds,
        seed=seed,
        output_dir=output_dir,
    )
    if options.source.dummy:
        err_console.print(RANDOM_WEIGHTS_EVAL_NOTE)
    run_eval(options, err_console)


RANDOM_WEIGHTS_EVAL_NOTE = (
    "[bold yellow]Random weights:[/] fidelity and MCD measure numerical agreement with the "
    "reference configuration, not speech quality."
)


@app.command(name="bench-engine")
@user_errors
def bench_engine(
    checkpoint: Annotated[
        Path | None, typer.Option(help="Checkpoint folder; default: full-size random weights.")
    ] = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    kv_cache_dtypes: Annotated[str, typer.Option(help="Comma list of KV dtypes.")] = "bf16",
    modes: Annotated[str, typer.Option(help="Comma list: graphs, eager.")] = "graphs,eager",
    batch_sizes: Annotated[str, typer.Option(help="Comma list of batch sizes.")] = "1,8,32",
    context: Annotated[int, typer.Option(help="Prompt positions per sequence.")] = 1000,
    frames: Annotated[int, typer.Option(help="Timed decode steps per point.")] = 64,
    output: Annotated[Path | None, typer.Option(help="JSON results (+ .md table).")] = None,
) -> None:
    """Engine decode speed: ms per step and frames/s per batch size, KV dtype and mode."""
    from fishserve.bench.engine_speed import run_engine_bench
    from fishserve.models.loading import load_text2semantic, resolve_device, resolve_dtype

    dev = resolve_device(device)
    model, tokenizer = load_text2semantic(
        checkpoint,
        device=dev,
        dtype=resolve_dtype(dtype, dev),
        load_format="auto" if checkpoint else "dummy",
    )
    run_engine_bench(
        model,
        tokenizer,
        kv_cache_dtypes.split(","),
        modes.split(","),
        [int(b) for b in batch_sizes.split(",")],
        context,
        frames,
        output,
        err_console,
    )


@app.command(name="bench-decoder")
@user_errors
def bench_decoder(
    decoder_checkpoint: DecoderCkptOpt = None,
    decoder_config: DecoderCfgOpt = None,
    device: DeviceOpt = "auto",
    dtypes: Annotated[str, typer.Option(help="Comma list of weight dtypes.")] = "bf16,fp32",
    batch_sizes: Annotated[str, typer.Option(help="Comma list of jobs per call.")] = "1,8,32",
    chunk: Annotated[int, typer.Option(help="New frames per job.")] = 64,
    repeats: Annotated[int, typer.Option(help="Timed calls per point.")] = 10,
    output: Annotated[Path | None, typer.Option(help="JSON results (+ .md table).")] = None,
) -> None:
    """Batched decoder throughput (random released-size weights unless a checkpoint is given)."""
    from fishserve.bench.decoder_speed import run_decoder_bench
    from fishserve.models.firefly import load_firefly
    from fishserve.models.loading import DTYPES, resolve_device

    dev = resolve_device(device)
    fmt = "auto" if decoder_checkpoint else "dummy"
    decoders = {
        name: load_firefly(
            decoder_checkpoint, decoder_config, device=dev, dtype=DTYPES[name], load_format=fmt
        )
        for name in dtypes.split(",")
    }
    run_decoder_bench(
        decoders, [int(b) for b in batch_sizes.split(",")], chunk, repeats, output, err_console
    )


def main() -> None:
    """Console-script entry point."""
    app()
