"""`fishserve bench-decoder`: batched Firefly decoding throughput (code frames per second).

Each job is one streaming chunk as the server decodes it: `left_context` frames of context
plus `chunk` new frames (`fishserve.audio.streaming`); B jobs go through one call. With several
chunk lengths (``--chunk 10,40``) the jobs of a call take them in turn, as a loaded server's
calls mix first chunks and later ones (the trimmed head computes each job only as far back as
its own new frames need, `TritonHead.skip_rows`). Modes:
``eager`` is one plain `decode_batch` call (conv1d, no compilation); the others run the
server's `DecoderRunner` (one CUDA graph per shape bucket; on CPU it runs eager): ``graphs``
with the PyTorch head, ``triton`` with the fused Triton head and trimmed context (the
server's default on CUDA: each layer computes only what the new frames need), ``triton-full``
the same head decoding every context frame at every layer (before trimming), ``compiled`` with
the PyTorch head fused by torch.compile, ``triton-pipelined`` the ``triton`` runner fed as the
server's decoder thread feeds it under load: `PIPELINED_CALLS` calls back to back, each launched
before the last one's audio is read (`DecoderRunner.start_jobs`), timed together (ms per call =
their time over their number), so the host's work between calls overlaps the GPU's.
Reported: ms per call, new frames per second, real-time streams the decoder alone could feed
(frames/s over the decoder's frame rate: 44,100 / 2,048 = 21.53 for the release), peak GPU
memory, and the runner's start-up (compile + capture) time.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
from rich.console import Console

from fishserve.audio.batching import DecodeJob, decode_batch
from fishserve.audio.decoder_runner import MAX_IN_FLIGHT, DecoderRunner
from fishserve.audio.streaming import ChunkPolicy, receptive_field_frames
from fishserve.bench.tables import render_table, write_results
from fishserve.models.firefly import FireflyGenerator

MODES = ("eager", "graphs", "triton", "triton-full", "compiled", "triton-pipelined")
PIPELINED_CALLS = 8  # calls per timed repeat of `triton-pipelined`


def decode_pipelined(runner: DecoderRunner, jobs: Sequence[DecodeJob], calls: int) -> None:
    """`calls` calls of `jobs`, each launched before the previous one's audio is read."""
    pending: deque = deque()
    for _ in range(calls):
        if len(pending) == MAX_IN_FLIGHT:
            pending.popleft().result()
        pending.append(runner.start_jobs(jobs))
    while pending:
        pending.popleft().result()


@dataclass
class DecoderBenchResult:
    """One measured point."""

    dtype: str
    mode: str
    batch: int
    chunk: int  # new frames of the longest job
    context: int
    ms_per_call: float
    frames_per_s: float
    realtime_streams: float
    peak_gpu_bytes: int
    startup_s: float
    chunks: list[int]  # the jobs' new frames, taken in turn


def make_jobs(
    decoder: FireflyGenerator,
    batch: int,
    chunks: list[int],
    seed: int = 0,
    whole_clips: bool = False,
) -> list[DecodeJob]:
    """`batch` random jobs of receptive-field context + new frames, job i taking
    ``chunks[i % len(chunks)]`` (no context with `whole_clips`: each job is a clip decoded at
    once, as a non-streaming server does)."""
    rng = np.random.default_rng(seed)
    context = 0 if whole_clips else receptive_field_frames(decoder.config)
    groups = decoder.config.n_groups
    news = [chunks[i % len(chunks)] for i in range(batch)]
    return [
        DecodeJob(rng.integers(0, 1000, (groups, context + n), dtype=np.int64), context)
        for n in news
    ]


def time_calls(call: Callable[[], object], cuda: bool, repeats: int) -> float:
    """Median seconds of one call (synchronised), after one warm-up call."""
    call()
    times = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def build_runner(decoder: FireflyGenerator, max_batch: int, chunk: int, mode: str) -> DecoderRunner:
    """The server's runner for a `chunk`-frame schedule (buckets up to context + chunk)."""
    policy = ChunkPolicy(first_chunk_frames=chunk, chunk_frames=chunk)
    kernels = "triton" if mode.startswith("triton") else "torch"
    return DecoderRunner.for_policy(
        decoder,
        policy,
        max_batch,
        trim=mode in ("triton", "triton-pipelined"),
        compile=mode == "compiled",
        kernels=kernels,
    )


def bench_mode(
    name: str,
    decoder: FireflyGenerator,
    mode: str,
    batches: list[int],
    chunks: list[int],
    repeats: int,
    whole_clips: bool = False,
) -> list[DecoderBenchResult]:
    """All batch sizes of one weight dtype and mode (jobs' new frames: `chunks`, in turn)."""
    if mode not in MODES:
        raise ValueError(f"unknown decoder bench mode {mode!r}; use {', '.join(MODES)}")
    cuda = decoder.device.type == "cuda"
    start = time.perf_counter()
    runner = None
    if mode != "eager":
        runner = build_runner(decoder, max(batches), max(chunks), mode)
    startup = time.perf_counter() - start
    results = []
    for batch in batches:
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        jobs = make_jobs(decoder, batch, chunks, whole_clips=whole_clips)
        used = chunks[: min(batch, len(chunks))]  # a smaller batch takes only the first lengths
        calls = PIPELINED_CALLS if mode == "triton-pipelined" else 1
        if runner is None:
            call = partial(decode_batch, decoder, jobs)
        elif calls > 1:
            call = partial(decode_pipelined, runner, jobs[: runner.max_batch], calls)
        else:
            call = partial(runner.decode_jobs, jobs)
        seconds = time_calls(call, cuda, repeats) / calls
        fps = sum(job.new_frames for job in jobs) / seconds
        peak = torch.cuda.max_memory_allocated() if cuda else 0
        results.append(
            DecoderBenchResult(
                name,
                mode,
                batch,
                max(used),
                jobs[0].context_frames,
                seconds * 1e3,
                fps,
                fps / decoder.config.frame_rate,
                peak,
                startup,
                list(used),
            )
        )
    return results


def run_decoder_bench(
    decoders: dict[str, FireflyGenerator],
    modes: list[str],
    batches: list[int],
    chunks: list[int],
    repeats: int,
    output: Path | None,
    console: Console,
    whole_clips: bool = False,
) -> list[DecoderBenchResult]:
    """Sweep weight dtypes x modes x batch sizes; print a table, write JSON (+ .md) if asked.

    With `whole_clips`, jobs have no left context (see `make_jobs`)."""
    results = []
    for name, decoder in decoders.items():
        for mode in modes:
            results += bench_mode(name, decoder, mode, batches, chunks, repeats, whole_clips)
    head = ["weights", "mode", "batch", "chunk", "ctx", "ms/call", "frames/s", "RT streams"]
    head += ["peak GiB", "start-up s"]
    rows = [
        [
            r.dtype,
            r.mode,
            str(r.batch),
            ",".join(map(str, r.chunks)),
            str(r.context),
            f"{r.ms_per_call:.2f}",
            f"{r.frames_per_s:,.0f}",
            f"{r.realtime_streams:,.1f}",
            f"{r.peak_gpu_bytes / 2**30:.2f}",
            f"{r.startup_s:.1f}",
        ]
        for r in results
    ]
    markdown = render_table(head, rows, console)
    write_results(output, [asdict(r) for r in results], markdown)
    return results
