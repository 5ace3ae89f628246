"""`fishserve bench-sampler`: the slow token's sampler, full sort vs top-k prefilter.

The slow token is drawn from 102,048 logits per row. `sample` sorts each row for top-p;
`sample_token` with a prefilter takes the top k candidates (`torch.topk`) and falls back to the
full sort only for rows whose nucleus is not inside them (`resample_rows_`). How often that
happens depends on the logits: a trained model puts nearly all of its mass on a few semantic
tokens (prefilter decides every row), the random-weight model (`--load-format dummy`) gives
nearly flat logits (every row falls back). Both are timed here on synthetic Gaussian logits
(standard deviation `peaked_scale` and `flat_scale`), with the reference settings (temperature
0.7, top-p 0.7, repetition penalty 1.2 over a 16-token window).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from rich.console import Console

from fishserve.bench.tables import render_table, write_results
from fishserve.engine.frame import BatchSampling, inexact_rows, resample_rows_, sample_token
from fishserve.models.loading import PEAKED_LOGIT_STD

VOCAB = 102_048  # released slow vocabulary (spec §1)


@dataclass
class SamplerBenchResult:
    """One measured point: ms per batch for both samplers on one kind of logits."""

    logits: str
    batch: int
    k: int
    full_ms: float
    prefilter_ms: float
    exact_rows: float


def _timed(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


def _params(batch: int, device: torch.device) -> BatchSampling:
    ones = torch.ones(batch, device=device)
    ids = torch.arange(batch, device=device)
    return BatchSampling(ones * 0.7, ones * 0.7, ones * 1.2, ids, ids * 0, ids * 0 + 5)


def bench_point(
    kind: str, scale: float, batch: int, k: int, device: torch.device, repeats: int
) -> SamplerBenchResult:
    """Time both samplers on (batch, VOCAB) Gaussian logits of standard deviation `scale`."""
    gen = torch.Generator(device=device).manual_seed(batch)
    logits = torch.randn(batch, VOCAB, device=device, generator=gen) * scale
    window = torch.randint(0, VOCAB, (batch, 16), device=device, generator=gen)
    params = _params(batch, device)

    def prefiltered() -> torch.Tensor:
        token, exact = sample_token(logits, params, window, k)
        rows = inexact_rows(exact)
        if rows is not None:
            resample_rows_(token, rows, logits[rows], params, window)
        return token

    _, exact = sample_token(logits, params, window, k)
    assert exact is not None
    return SamplerBenchResult(
        kind,
        batch,
        k,
        _timed(lambda: sample_token(logits, params, window, 0), device, repeats),
        _timed(prefiltered, device, repeats),
        float(exact.float().mean()),
    )


def run_sampler_bench(
    batches: list[int],
    k: int,
    device: torch.device,
    repeats: int,
    output: Path | None,
    console: Console,
    peaked_scale: float = PEAKED_LOGIT_STD,
    flat_scale: float = 0.64,
) -> list[SamplerBenchResult]:
    """Both kinds of logits x batch sizes; prints a table, writes JSON (+ .md) if asked."""
    results = [
        bench_point(kind, scale, b, k, device, repeats)
        for kind, scale in (("peaked", peaked_scale), ("flat", flat_scale))
        for b in batches
    ]
    head = ["logits", "batch", "k", "full sort ms", "prefilter ms", "rows decided by prefilter"]
    rows = [
        [
            r.logits,
            str(r.batch),
            str(r.k),
            f"{r.full_ms:.3f}",
            f"{r.prefilter_ms:.3f}",
            f"{r.exact_rows:.0%}",
        ]
        for r in results
    ]
    markdown = render_table(head, rows, console)
    write_results(output, [asdict(r) for r in results], markdown)
    return results
