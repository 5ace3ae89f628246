"""`fishserve bench`, `eval`, `bench-engine`, `bench-engine-load`, `bench-sampler`,
`bench-decoder`, `probe` and `profile-gaps`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fishserve.cli import (
    DecoderCfgOpt,
    DecoderCkptOpt,
    DeviceOpt,
    DtypeOpt,
    TopPOpt,
    app,
    err_console,
    user_errors,
)


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
        typer.Option(
            min=1,
            help="Requests per level (default: max(16, 4 x concurrency); 64 per Poisson rate).",
        ),
    ] = None,
    duration: Annotated[
        float, typer.Option(min=0.1, help="Per level: start no request after this (s).")
    ] = 180.0,
    ramp: Annotated[
        float,
        typer.Option(min=0, help="Closed loop: spread the first requests over this many s."),
    ] = 0.0,
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
        int | None, typer.Option(min=2, help="Frames per segment cap (Fish API; >= 2).")
    ] = None,
    ignore_eos: Annotated[
        bool, typer.Option(help="Generate exactly --max-new-tokens frames (fishserve).")
    ] = False,
    chunk_length: Annotated[
        int,
        typer.Option(min=100, max=300, help="Fish `chunk_length`: text segment size in bytes."),
    ] = 200,
    audio_format: Annotated[
        str, typer.Option("--format", help="pcm (s16le) or wav; audio is counted exactly.")
    ] = "pcm",
    streaming: Annotated[bool, typer.Option(help="Fish `streaming` field.")] = True,
    model: Annotated[str, typer.Option(help="OpenAI `model` field.")] = "fish-speech-1.5",
    extra_body: Annotated[
        str | None, typer.Option(help="JSON object merged into every request body.")
    ] = None,
    api_key: Annotated[str | None, typer.Option(help="Bearer token.")] = None,
    timeout: Annotated[
        float,
        typer.Option(min=1, help="Seconds a request may take, sent to last byte; then a timeout."),
    ] = 600.0,
    sample_rate: Annotated[
        int, typer.Option(help="PCM rate (Hz) when the server sends no X-Sample-Rate.")
    ] = 44100,
    frame_rate: Annotated[
        float, typer.Option(help="Audio frames per second, for frames/s (44100/2048).")
    ] = 44100 / 2048,
    max_inflight: Annotated[int, typer.Option(min=1, help="Poisson: open requests cap.")] = 1024,
    processes: Annotated[
        int,
        typer.Option(
            min=1,
            max=64,
            help="Load-generator processes, each sending its share of every level (one "
            "process handles a few hundred streams; give several for ~1,000).",
        ),
    ] = 1,
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
        ramp_s=ramp,
        warmup=warmup,
        timeout_s=timeout,
        sample_rate=sample_rate,
        frame_rate=frame_rate,
        max_inflight=max_inflight,
        processes=processes,
        api_key=api_key,
        poll_interval_s=poll_interval,
        label=label,
        output_dir=output_dir,
    )
    report = run_bench(options, err_console)
    if not any(level.ok for level in report.levels):
        err_console.print("error: no request succeeded (see the errors column)", markup=False)
        raise typer.Exit(1)


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

if TYPE_CHECKING:  # imported lazily at run time: `fishserve --help` stays fast
    from fishserve.models.dual_ar import DualARTransformer
    from fishserve.models.tokenizer import FishTokenizer

BenchCkptOpt = Annotated[
    Path | None, typer.Option(help="Checkpoint folder; default: full-size random weights.")
]


def load_bench_model(
    checkpoint: Path | None, device: str, dtype: str, dummy_logits: str
) -> tuple[DualARTransformer, FishTokenizer]:
    """The text-to-semantic model and tokenizer of a speed bench: the checkpoint's, or the
    full-size architecture with random weights (`dummy_logits` "flat" or "peaked").

    Raises:
        ValueError, FileNotFoundError: what `load_text2semantic` raises.
    """
    from fishserve.models.loading import load_text2semantic, resolve_device, resolve_dtype

    dev = resolve_device(device)
    return load_text2semantic(
        checkpoint,
        device=dev,
        dtype=resolve_dtype(dtype, dev),
        load_format="auto" if checkpoint else "dummy",
        dummy_logits=dummy_logits,
    )


def check_engine_sms(device: str) -> None:
    """An engine SM partition needs a CUDA device and the `cuda-bindings` package.

    Raises:
        ValueError: either is missing.
    """
    from fishserve.engine.sm_partition import NO_CUDA_BINDINGS, cuda_bindings_installed
    from fishserve.models.loading import resolve_device

    dev = resolve_device(device)
    if dev.type != "cuda":
        raise ValueError(f"--engine-sms needs a CUDA device, but the device is {dev}")
    if not cuda_bindings_installed():
        raise ValueError(NO_CUDA_BINDINGS)


@app.command(name="bench-engine")
@user_errors
def bench_engine(
    checkpoint: BenchCkptOpt = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    kv_cache_dtypes: Annotated[
        str,
        typer.Option(help="Comma list of KV dtypes (auto: the weights' dtype, as `serve`)."),
    ] = "auto",
    modes: Annotated[
        str,
        typer.Option(
            help="Comma list: graphs, async (CUDA graphs, the next step launched before the "
            "last one's frames are read), eager, graphs-opbyop (CUDA graphs, the fast "
            "transformer not compiled). On a CPU, graphs and async run the same static-shape "
            "step without graphs (the table's graphs column: 0)."
        ),
    ] = "graphs,eager",
    batch_sizes: Annotated[str, typer.Option(help="Comma list of batch sizes.")] = "1,8,32",
    context: Annotated[int, typer.Option(min=1, help="Prompt positions per sequence.")] = 1000,
    frames: Annotated[int, typer.Option(min=1, help="Timed decode steps per point.")] = 64,
    top_k_prefilter: Annotated[
        int,
        typer.Option(min=0, help="Top-p candidates checked before a full sort (0: always sort)."),
    ] = 1024,
    output: Annotated[Path | None, typer.Option(help="JSON results (+ .md table).")] = None,
    dummy_logits: Annotated[
        str,
        typer.Option(
            help="Random weights only: flat (plain random init; every row takes the sampler's "
            "exact fallback) or peaked (slow logits with std 8, like bench-sampler's "
            "trained-model stand-in)."
        ),
    ] = "flat",
    profile_steps: Annotated[
        int,
        typer.Option(
            min=0,
            help="Also profile this many steps per point (torch.profiler): kernels per step, "
            "device time and span; operator tables beside --output.",
        ),
    ] = 0,
) -> None:
    """Engine decode speed: ms per step and frames/s per batch size, KV dtype and mode."""
    from fishserve.bench.engine_speed import ENGINE_MODES, run_engine_bench
    from fishserve.bench.options import parse_names, parse_sizes
    from fishserve.engine.kv_cache import KV_CACHE_DTYPES

    check_json_output(output)

    batches = parse_sizes(batch_sizes, "--batch-sizes")
    mode_names = parse_names(modes, ENGINE_MODES, "--modes")
    kv_names = parse_names(kv_cache_dtypes, KV_CACHE_DTYPES, "--kv-cache-dtypes")
    model, tokenizer = load_bench_model(checkpoint, device, dtype, dummy_logits)
    run_engine_bench(
        model,
        tokenizer,
        list(kv_names),
        list(mode_names),
        batches,
        context,
        frames,
        output,
        err_console,
        top_k_prefilter,
        profile_steps,
    )


@app.command(name="bench-engine-load")
@user_errors
def bench_engine_load(
    checkpoint: BenchCkptOpt = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    streams: Annotated[str, typer.Option(help="Comma list: streams kept in flight.")] = "64,256",
    modes: Annotated[
        str, typer.Option(help="Comma list: sync, async (asynchronous scheduling).")
    ] = "async",
    frames: Annotated[
        int,
        typer.Option(min=2, help="Frames per stream (as max_new_tokens: the first is not audio)."),
    ] = 216,
    context: Annotated[int, typer.Option(min=1, help="Prompt positions per stream.")] = 40,
    duration: Annotated[float, typer.Option(min=0.01, help="Measured seconds per point.")] = 10.0,
    warmup: Annotated[float, typer.Option(min=0, help="Seconds run before measuring.")] = 2.0,
    ramp: Annotated[int, typer.Option(min=1, help="New streams per step at the start.")] = 8,
    boost_frames: Annotated[
        int, typer.Option(min=0, help="Boost steps for streams below this many frames (0: off).")
    ] = 64,
    boost_min_running: Annotated[
        int,
        typer.Option(
            min=0, help="Boost steps only while this many other streams are past their boost."
        ),
    ] = 64,
    first_chunk: Annotated[
        int, typer.Option(min=1, help="Audio frames of a first chunk (its time is reported).")
    ] = 10,
    engine_sms: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Run the steps on this many SMs, as `serve --engine-sms` (CUDA, cuda-bindings).",
        ),
    ] = None,
    kv_cache_dtype: Annotated[str, typer.Option(help="KV dtype (auto: the weights').")] = "auto",
    output: Annotated[Path | None, typer.Option(help="JSON results (+ .md table).")] = None,
    dummy_logits: Annotated[
        str, typer.Option(help="Random weights only: flat or peaked slow logits.")
    ] = "peaked",
) -> None:
    """The engine alone under a steady load: N streams in flight, started and replaced as they
    finish; steps/s, frames/s, real-time margin, time to first frame and first chunk (of the
    streams submitted in the measured window)."""
    from fishserve.bench.engine_load import LOAD_MODES, LoadSettings, run_engine_load
    from fishserve.bench.options import parse_names, parse_sizes
    from fishserve.engine.kv_cache import KV_CACHE_DTYPES
    from fishserve.engine.step_profiler import StepProfiler

    check_json_output(output)
    counts = parse_sizes(streams, "--streams")
    mode_names = parse_names(modes, LOAD_MODES, "--modes")
    parse_names(kv_cache_dtype, KV_CACHE_DTYPES, "--kv-cache-dtype")
    settings = LoadSettings(
        frames=frames,
        context=context,
        duration=duration,
        warmup=warmup,
        ramp=ramp,
        boost_frames=boost_frames,
        boost_min_running=boost_min_running,
        first_chunk=first_chunk,
        kv_cache_dtype=kv_cache_dtype,
        engine_sms=engine_sms,
    )
    settings.check()
    if engine_sms is not None:  # before the model loads
        check_engine_sms(device)
    StepProfiler.from_env()  # bad profiler variables fail here, before the model loads
    logits = dummy_logits if checkpoint is None else "flat"  # its default is for random weights
    model, tokenizer = load_bench_model(checkpoint, device, dtype, logits)
    run_engine_load(model, tokenizer, counts, list(mode_names), settings, output, err_console)


@app.command(name="probe")
@user_errors
def probe(device: DeviceOpt = "auto") -> None:
    """How fast this machine is: the host probe (a fixed Python and NumPy workload, ms, higher
    is slower) and, on a GPU, the device probe (us per graph kernel, bf16 TFLOP/s, clocks).
    Run it beside a benchmark to tell machines apart."""
    from fishserve.bench.device_probe import describe, device_probe
    from fishserve.host_probe import host_probe_ms
    from fishserve.models.loading import resolve_device

    dev = resolve_device(device)
    print(f"host probe: {host_probe_ms():.1f} ms (higher is slower)")
    if dev.type == "cuda":
        print(describe(device_probe(dev)))


@app.command(name="profile-gaps")
@user_errors
def profile_gaps(
    trace: Annotated[Path, typer.Argument(help="Chrome trace (JSON) of torch.profiler.")],
    top: Annotated[int, typer.Option(min=1, help="Longest gaps to list.")] = 15,
) -> None:
    """Where the GPU sat idle in a step profile: busy share of the device and of each CUDA
    stream, then the device's gaps (no stream running anything) by length, each host-bound
    (its work launched only after the device went idle) or queued."""
    from fishserve.bench.trace_gaps import analyse, render

    print(render(analyse(trace), top))


@app.command(name="bench-sampler")
@user_errors
def bench_sampler(
    device: DeviceOpt = "auto",
    batch_sizes: Annotated[str, typer.Option(help="Comma list of rows.")] = "1,64,256,512",
    top_k_prefilter: Annotated[int, typer.Option(min=1, help="Prefilter candidates.")] = 1024,
    repeats: Annotated[int, typer.Option(min=1, help="Timed calls per point.")] = 20,
    output: Annotated[Path | None, typer.Option(help="JSON results (+ .md table).")] = None,
) -> None:
    """Slow-token sampler: full-sort top-p vs top-k prefilter, on peaked and flat logits."""
    from fishserve.bench.options import parse_sizes
    from fishserve.bench.sampler_speed import VOCAB, run_sampler_bench
    from fishserve.models.loading import resolve_device

    check_json_output(output)

    batches = parse_sizes(batch_sizes, "--batch-sizes")
    if top_k_prefilter >= VOCAB:
        raise ValueError(f"--top-k-prefilter must be below the vocabulary ({VOCAB:,})")
    dev = resolve_device(device)
    run_sampler_bench(batches, top_k_prefilter, dev, repeats, output, err_console)


@app.command(name="bench-decoder")
@user_errors
def bench_decoder(
    decoder_checkpoint: Annotated[
        Path | None,
        typer.Option(
            "--decoder-checkpoint",
            help="Firefly generator weights (.pth); default: random weights of the released size "
            "(speed does not depend on weight values).",
        ),
    ] = None,
    decoder_config: DecoderCfgOpt = None,
    device: DeviceOpt = "auto",
    dtypes: Annotated[str, typer.Option(help="Comma list of weight dtypes.")] = "bf16,fp32",
    batch_sizes: Annotated[str, typer.Option(help="Comma list of jobs per call.")] = "1,8,32",
    chunk: Annotated[
        str,
        typer.Option(
            help="New frames per job; a comma list (e.g. 10,40) gives the jobs of a call those "
            "lengths in turn (job i the i-th, cyclically: a batch of 1 takes only the first), as "
            "a loaded server's calls mix first and later chunks."
        ),
    ] = "64",
    repeats: Annotated[int, typer.Option(min=1, help="Timed calls per point.")] = 10,
    modes: Annotated[
        str,
        typer.Option(
            help="Comma list: eager (plain call), graphs (runner, PyTorch head), "
            "triton (runner, Triton head, trimmed context; CUDA), triton-full (the same, "
            "every context frame decoded at every layer), compiled (runner, compiled "
            "PyTorch head), triton-pipelined (triton, 8 calls back to back, each launched "
            "before the last one's audio is read)."
        ),
    ] = "eager,graphs",
    output: Annotated[Path | None, typer.Option(help="JSON results (+ .md table).")] = None,
    whole_clips: Annotated[
        bool,
        typer.Option(
            help="Jobs are whole clips of --chunk frames with no left context (e.g. --chunk 646 "
            "for 30 s), as a non-streaming server decodes; default: streaming chunks."
        ),
    ] = False,
) -> None:
    """Batched decoder throughput (random released-size weights unless --decoder-checkpoint)."""
    from fishserve.audio.decoder_runner import resolve_kernels
    from fishserve.bench.decoder_speed import MODES, run_decoder_bench
    from fishserve.bench.options import parse_names, parse_sizes
    from fishserve.models.firefly import load_firefly
    from fishserve.models.loading import DTYPES, resolve_device

    check_json_output(output)

    batches = parse_sizes(batch_sizes, "--batch-sizes")
    chunks = parse_sizes(chunk, "--chunk")
    mode_names = parse_names(modes, MODES, "--modes")
    dtype_names = parse_names(dtypes, tuple(DTYPES), "--dtypes")
    dev = resolve_device(device)
    if any(name.startswith("triton") for name in mode_names):
        resolve_kernels("triton", dev)  # before the decoders load
    fmt = "auto" if decoder_checkpoint else "dummy"
    decoders = {
        name: load_firefly(
            decoder_checkpoint, decoder_config, device=dev, dtype=DTYPES[name], load_format=fmt
        )
        for name in dtype_names
    }
    run_decoder_bench(
        decoders,
        list(mode_names),
        batches,
        chunks,
        repeats,
        output,
        err_console,
        whole_clips=whole_clips,
    )


def check_json_output(output: Path | None) -> None:
    """A speed bench's `--output` (None: none) ends in .json in an existing, writable folder:
    checked before the run, as synth checks its outputs (the .md table goes beside it).

    Raises:
        ValueError, OSError: what `fishserve.audio.io.check_output_path` raises.
    """
    from fishserve.audio.io import check_output_path

    if output is not None:
        check_output_path(output, "--output", (".json",))
