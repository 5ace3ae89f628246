"""`fishserve bench-engine`: decode speed of the engine itself (no HTTP, no audio decoder).

For each KV dtype and mode (CUDA graphs; CUDA graphs with asynchronous scheduling, "async";
CUDA graphs with the fast transformer run op by op instead of compiled, "graphs-opbyop";
or eager), one engine is built on the full-size
architecture with random weights; for each batch size B, B requests with prompts of
`--context` positions are prefilled, then `--frames` decode steps are timed (each step emits
one frame for every sequence; output length fixed with ignore_eos). Reported: ms per step,
frames per second (B / step time), time to first frame of a lone request, peak GPU memory,
KV bytes per position and CUDA graph captures. With `--profile-steps N`, N more steps per point
run under `torch.profiler` (`fishserve.bench.step_profile`): kernels per step, their device
time and the device span, plus an operator table per point next to `--output`.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from rich.console import Console

from fishserve.bench import tables
from fishserve.bench.step_profile import StepProfile, profile_steps
from fishserve.engine.engine import EngineConfig, GenerationRequest, LLMEngine
from fishserve.engine.sampling import SamplingParams
from fishserve.models.dual_ar import DualARTransformer
from fishserve.models.tokenizer import FishTokenizer
from fishserve.progress import progress_bar

FRAMES_PER_SECOND = 44100 / 2048  # audio frames per second of speech (spec §0)
ENGINE_MODES = ("graphs", "async", "eager", "graphs-opbyop")


@dataclass
class EngineBenchResult:
    """One measured point."""

    kv_cache_dtype: str
    mode: str
    batch: int
    context: int
    ms_per_step: float
    frames_per_s: float
    realtime_streams: float
    peak_gpu_bytes: int
    kv_bytes_per_token: int
    graph_captures: int
    profile: StepProfile | None = None


def check_fits_context(max_seq_len: int, context: int, frames: int, profile: int) -> None:
    """Refuse a run whose sequences would reach the model's context (`max_seq_len` positions)
    before its timed and profiled steps end: they would finish, and the remaining steps time
    empty batches.

    Raises:
        ValueError: naming the options.
    """
    needed = context + frames + profile + 8  # + the first frame and fill_decode's margin
    if needed > max_seq_len:
        raise ValueError(
            f"--context {context} + --frames {frames} + --profile-steps {profile} (+8) = "
            f"{needed} positions; the model's context is {max_seq_len}: lower them"
        )


def prompt_text(tokenizer: FishTokenizer, positions: int) -> str:
    """A text whose prompt is about `positions` long (prompt overhead subtracted)."""
    overhead = len(tokenizer.encode("<|im_start|>user\n<|im_end|><|im_start|>assistant\n")) + 1
    words = "the quick brown fox jumps over a lazy dog "
    text = ""
    while len(tokenizer.encode(text)) < positions - overhead:
        text += words
    return text


def fixed_request(text: str, seed: int, frames: int, request_id: str) -> GenerationRequest:
    """A benchmark request: one segment of exactly `frames` frames (ignore_eos), fixed sampling
    (temperature 0.7, top_p 0.7, repetition penalty 1.2)."""
    return GenerationRequest(
        text,
        [],
        SamplingParams(0.7, 0.7, 1.2, seed=seed),
        chunk_length=0,
        max_new_tokens=frames,
        ignore_eos=True,
        request_id=request_id,
    )


def fill_decode(engine: LLMEngine, batch: int, text: str, frames: int) -> None:
    """Submit `batch` requests and step until every one is decoding."""
    for i in range(batch):
        engine.add_request(fixed_request(text, i, frames + 4, f"b{i}"))
    while any(not seq.frames for seq in engine.sequences.values()):
        engine.step()


def time_steps(engine: LLMEngine, steps: int) -> float:
    """Median wall seconds of `steps` engine steps (each synchronises on its frames)."""
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2]


def run_point(
    engine: LLMEngine, batch: int, text: str, frames: int, profile: int = 0
) -> tuple[float, StepProfile | None]:
    """Seconds per decode step at `batch`, and a profile of `profile` more steps (0: none);
    leaves the engine empty."""
    fill_decode(engine, batch, text, frames + profile)
    seconds = time_steps(engine, frames)
    profiled = profile_steps(engine.step, profile) if profile else None
    for rid in list(engine.sequences):
        engine.abort(rid)
    return seconds, profiled


def bench_config(
    model: DualARTransformer,
    tokenizer: FishTokenizer,
    kv: str,
    mode: str,
    batches: list[int],
    context: int,
    frames: int,
    top_k_prefilter: int = 1024,
    profile: int = 0,
) -> list[EngineBenchResult]:
    """All batch sizes for one KV dtype and mode (`profile`: steps profiled per point)."""
    block = 16
    per_seq = -(-(context + frames + profile + 64) // block)
    config = EngineConfig(
        kv_cache_dtype=kv,
        block_size=block,
        max_num_seqs=max(batches),
        max_num_batched_tokens=8192,
        num_kv_blocks=per_seq * max(batches),
        enforce_eager=mode == "eager",
        decoder_workspace_bytes=0,
        top_k_prefilter=top_k_prefilter,
        async_scheduling=mode == "async",
        compile_fast_transformer=mode != "graphs-opbyop",
        static_decode=mode != "eager",  # on a CPU too: async needs the static step
    )
    engine = LLMEngine(model, tokenizer, config)
    text = prompt_text(tokenizer, context)
    results = []
    for batch in batches:
        torch.cuda.reset_peak_memory_stats() if torch.cuda.is_available() else None
        seconds, profiled = run_point(engine, batch, text, frames, profile)
        peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
        fps = batch / seconds
        results.append(
            EngineBenchResult(
                engine.cache.layout.dtype,  # `auto` resolved
                mode,
                batch,
                context,
                seconds * 1e3,
                fps,
                fps / FRAMES_PER_SECOND,
                peak,
                engine.cache.layout.bytes_per_token,
                engine.runner.num_captures,
                profiled,
            )
        )
    del engine
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return results


def time_to_first_frame(model: DualARTransformer, tokenizer: FishTokenizer, context: int) -> float:
    """Seconds from submission to the first frame of a lone request (prefill + sample)."""
    engine = LLMEngine(
        model,
        tokenizer,
        EngineConfig(
            max_num_seqs=1, num_kv_blocks=256, enforce_eager=True, decoder_workspace_bytes=0
        ),
    )
    text = prompt_text(tokenizer, context)
    fill_decode(engine, 1, text, 4)  # warm-up
    for rid in list(engine.sequences):
        engine.abort(rid)
    start = time.perf_counter()
    fill_decode(engine, 1, text, 4)
    return time.perf_counter() - start


def render_results(results: list[EngineBenchResult], console: Console) -> str:
    """Print a rich table and return the same as markdown."""
    head = [
        "KV",
        "mode",
        "batch",
        "ctx",
        "ms/step",
        "frames/s",
        "RT streams",
        "peak GiB",
        "KV B/pos",
        "graphs",
    ]
    rows = [
        [
            r.kv_cache_dtype,
            r.mode,
            str(r.batch),
            str(r.context),
            f"{r.ms_per_step:.2f}",
            f"{r.frames_per_s:,.0f}",
            f"{r.realtime_streams:,.1f}",
            f"{r.peak_gpu_bytes / 2**30:.2f}",
            str(r.kv_bytes_per_token),
            str(r.graph_captures),
        ]
        for r in results
    ]
    markdown = tables.render_table(head, rows, console)
    if any(r.profile is not None for r in results):
        markdown += "\n\n" + render_profiles(results, console)
    return markdown


def render_profiles(results: list[EngineBenchResult], console: Console) -> str:
    """The profiled points' per-step device numbers (`StepProfile`), as a table."""
    head = ["KV", "mode", "batch", "kernels/step", "kernel ms", "GPU span ms", "wall ms (profiled)"]
    rows = [
        [
            r.kv_cache_dtype,
            r.mode,
            str(r.batch),
            f"{r.profile.kernels:,.0f}",
            f"{r.profile.kernel_ms:.2f}",
            f"{r.profile.span_ms:.2f}",
            f"{r.profile.wall_ms:.2f}",
        ]
        for r in results
        if r.profile is not None
    ]
    return tables.render_table(head, rows, console)


def profile_path(output: Path, result: EngineBenchResult) -> Path:
    """Where a point's operator table goes: beside `output`, named by the point."""
    name = f"{output.stem}_profile_{result.kv_cache_dtype}_{result.mode}_b{result.batch}.txt"
    return output.with_name(name)


def run_engine_bench(
    model: DualARTransformer,
    tokenizer: FishTokenizer,
    kv_dtypes: list[str],
    modes: list[str],
    batches: list[int],
    context: int,
    frames: int,
    output: Path | None,
    console: Console,
    top_k_prefilter: int = 1024,
    profile: int = 0,
) -> list[EngineBenchResult]:
    """The whole sweep; writes JSON and markdown next to `output` if given (and with
    `profile` > 0 steps profiled per point, each point's operator table: `profile_path`).

    `top_k_prefilter` is the engine's (random weights give flat logits: every row falls back to
    the full sort, the slowest case; `fishserve bench-sampler` times both cases).

    Raises:
        ValueError: context + frames + profile do not fit in the model's context (steps past
            it would time empty batches: impossible frames/s).
    """
    check_fits_context(model.config.max_seq_len, context, frames, profile)
    results: list[EngineBenchResult] = []
    with progress_bar(console=console) as progress:
        task = progress.add_task("engine bench", total=len(kv_dtypes) * len(modes))
        for kv in kv_dtypes:
            for mode in modes:
                results += bench_config(
                    model, tokenizer, kv, mode, batches, context, frames, top_k_prefilter, profile
                )
                progress.advance(task)
    ttff = time_to_first_frame(model, tokenizer, context)
    markdown = render_results(results, console)
    console.print(
        f"time to first frame (prefill {context} positions, batch 1): {ttff * 1e3:.1f} ms"
    )
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        for r in results:
            if r.profile is not None:
                profile_path(output, r).write_text(r.profile.table)
        rows = [{**asdict(r), "profile": _numbers(r.profile)} for r in results]
        payload = {
            "results": rows,
            "ttff_ms": ttff * 1e3,
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        }
        output.write_text(json.dumps(payload, indent=2))
        output.with_suffix(".md").write_text(markdown + f"\n\nTTFF {ttff * 1e3:.1f} ms\n")
    return results


def _numbers(profile: StepProfile | None) -> dict[str, float] | None:
    """A profile without its table (the table goes to its own file)."""
    if profile is None:
        return None
    return {k: v for k, v in asdict(profile).items() if k != "table"}
