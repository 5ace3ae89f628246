"""Decoder call times with per-job skip rows on/off (mixed chunk lengths, padded batches)."""

import os
import time

import numpy as np
import torch

from fishserve.audio.batching import DecodeJob
from fishserve.audio.decoder_runner import DecoderRunner
from fishserve.audio.streaming import ChunkPolicy
from fishserve.models.firefly import load_firefly
from fishserve.models.firefly import triton_head as th

OUT = os.environ.get("OUT", "/tmp")
log = open(f"{OUT}/skipbench.txt", "a")


def p(s):
    print(s, flush=True)
    log.write(s + "\n")
    log.flush()


dec = load_firefly(None, None, device="cuda", dtype=torch.bfloat16, load_format="dummy")
t0 = time.perf_counter()
runner = DecoderRunner.for_policy(dec, ChunkPolicy(), 16, kernels="triton")
p(
    f"runner up in {time.perf_counter() - t0:.1f} s, buckets {runner.frame_buckets} x {runner.batch_buckets}"
)
rng = np.random.default_rng(0)
G, ctx = dec.config.n_groups, 15


def jobs(news):
    return [DecodeJob(rng.integers(0, 1000, (G, ctx + n), dtype=np.int64), ctx) for n in news]


cases = {
    "16x24": [24] * 16,
    "8 mixed (10-40)": [10, 10, 24, 24, 32, 40, 10, 16],
    "5x24 (batch 8)": [24] * 5,
    "8x10+8x40": [10] * 8 + [40] * 8,
    "1x10": [10],
    "3x10 (batch 4)": [10] * 3,
    "9x24 (batch 16)": [24] * 9,
}
real_skip = th.TritonHead.skip_rows


def no_skip(self, out_samples, steps, wanted):
    return np.zeros_like(real_skip(self, out_samples, steps, wanted))


def timed(js, n=30):
    runner.decode_jobs(js)
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        s = time.perf_counter()
        runner.decode_jobs(js)
        ts.append(time.perf_counter() - s)
    return sorted(ts)[n // 2] * 1e3


for name, news in cases.items():
    js = jobs(news)
    th.TritonHead.skip_rows = no_skip
    off = timed(js)
    a = runner.decode_jobs(js)
    th.TritonHead.skip_rows = real_skip
    on = timed(js)
    b = runner.decode_jobs(js)
    diff = max(float(np.abs(x - y).max()) for x, y in zip(a, b))
    p(
        f"{name:>18}: {sum(news):4d} new frames  no skip {off:6.2f} ms  skip {on:6.2f} ms  ({off / on:.2f}x)  max |diff| {diff:.2e}"
    )
