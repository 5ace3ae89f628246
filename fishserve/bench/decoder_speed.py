"""`fishserve bench-decoder`: batched Firefly decoding throughput (code frames per second).

Each job is one streaming chunk as the server decodes it: `left_context` frames of context
plus `chunk` new frames (`fishserve.audio.streaming`); B jobs go through one `decode_batch`
call. Reported: ms per call, new frames per second, real-time streams the decoder alone could
feed (frames/s / 21.53), and peak GPU memory, per weight dtype and batch size.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from fishserve.audio.batching import DecodeJob, decode_batch
from fishserve.audio.streaming import receptive_field_frames
from fishserve.models.firefly import FireflyGenerator

FRAMES_PER_SECOND = 44100 / 2048  # spec §0


@dataclass
class DecoderBenchResult:
    """One measured point."""

    dtype: str
    batch: int
    chunk: int
    context: int
    ms_per_call: float
    frames_per_s: float
    realtime_streams: float
    peak_gpu_bytes: int


def make_jobs(decoder: FireflyGenerator, batch: int, chunk: int, seed: int = 0) -> list[DecodeJob]:
    """`batch` random jobs of receptive-field context + `chunk` new frames."""
    rng = np.random.default_rng(seed)
    context = receptive_field_frames(decoder.config)
    groups = decoder.config.n_groups
    return [
        DecodeJob(rng.integers(0, 1000, (groups, context + chunk), dtype=np.int64), context)
        for _ in range(batch)
    ]


def time_calls(decoder: FireflyGenerator, jobs: list[DecodeJob], repeats: int) -> float:
    """Median seconds of one `decode_batch` call (synchronised)."""
    decode_batch(decoder, jobs)  # warm-up
    times = []
    for _ in range(repeats):
        if decoder.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        decode_batch(decoder, jobs)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def run_decoder_bench(
    decoders: dict[str, FireflyGenerator],
    batches: list[int],
    chunk: int,
    repeats: int,
    output: Path | None,
    console: Console,
) -> list[DecoderBenchResult]:
    """Sweep weight dtypes x batch sizes; print a table, write JSON (+ .md) if asked."""
    results = []
    for name, decoder in decoders.items():
        for batch in batches:
            cuda = decoder.device.type == "cuda"
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            jobs = make_jobs(decoder, batch, chunk)
            seconds = time_calls(decoder, jobs, repeats)
            fps = batch * chunk / seconds
            peak = torch.cuda.max_memory_allocated() if cuda else 0
            results.append(
                DecoderBenchResult(
                    name,
                    batch,
                    chunk,
                    jobs[0].context_frames,
                    seconds * 1e3,
                    fps,
                    fps / FRAMES_PER_SECOND,
                    peak,
                )
            )
    head = ["weights", "batch", "chunk", "ctx", "ms/call", "frames/s", "RT streams", "peak GiB"]
    table = Table(*head)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        row = [
            r.dtype,
            str(r.batch),
            str(r.chunk),
            str(r.context),
            f"{r.ms_per_call:.2f}",
            f"{r.frames_per_s:,.0f}",
            f"{r.realtime_streams:,.0f}",
            f"{r.peak_gpu_bytes / 2**30:.2f}",
        ]
        table.add_row(*row)
        lines.append("| " + " | ".join(row) + " |")
    console.print(table)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps([asdict(r) for r in results], indent=2))
        output.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return results
