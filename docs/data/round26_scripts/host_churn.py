"""Host time of the engine-alone load (bench-engine-load's loop) with the model math stubbed.

Usage: python host_churn.py STREAMS [profile]. The tiny fixture model on the CPU with
`decode_step_token`/`decode_step_codes` replaced by constant outputs, async scheduling, boost
64, streams of 216 frames kept in flight as in `fishserve bench-engine-load`: what is left is
the engine's and the load's host work per step (scheduling, inputs, frames, events, new
requests). With `profile`, cProfile's top functions by own time.
"""

from __future__ import annotations

import cProfile
import gc
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, "tests")
from conftest import TINY_T2S, load_tiny_model

import fishserve.engine.runner as rn
from fishserve.bench.engine_load import (
    LoadSettings,
    _Load,
    load_engine,
    prompt_positions,
)
from fishserve.bench.engine_speed import prompt_text
from fishserve.engine.decode_step import TokenStep
from fishserve.models.tokenizer import FishTokenizer

N = int(sys.argv[1])
model, tok = load_tiny_model(), FishTokenizer(TINY_T2S)
nc = model.config.num_codebooks
FRAMES = torch.randint(0, 1000, (8192, 1 + nc))
FRAMES[:, 0] = model.semantic_begin_id + 5


def fake_token(model, cache, inputs, use_triton, k):
    b = inputs.columns.shape[0]
    hidden = torch.zeros(b, model.config.dim)
    return TokenStep(hidden, FRAMES[:b, 0].clone(), torch.ones(b, dtype=torch.bool))


def fake_codes(model, step, inputs, compiled=False):
    return FRAMES[: step.token.shape[0]]


rn.decode_step_token, rn.decode_step_codes = fake_token, fake_codes
s = LoadSettings(frames=216, context=40, kv_cache_dtype="fp32")
text = prompt_text(tok, s.context)
engine = load_engine(model, tok, "async", N, s, prompt_positions(model, tok, text))
load = _Load(engine, N, text, s)
while load.count < N:
    load.step(s.ramp)
for _ in range(100):
    load.step(N)
if os.environ.get("GC") == "freeze":  # as the server after start-up (gc_control)
    gc.collect()
    gc.freeze()
elif os.environ.get("GC") == "off":
    gc.disable()
prof = cProfile.Profile() if sys.argv[2:3] == ["profile"] else None
steps0, t0 = engine.steps, time.perf_counter()
if prof:
    prof.enable()
for _ in range(200):
    load.step(N)
if prof:
    prof.disable()
dt = (time.perf_counter() - t0) / (engine.steps - steps0) * 1e3
print(f"{N} streams: {dt:.2f} ms host per step, running {len(engine.scheduler.running)}")
if prof:
    pstats.Stats(prof).sort_stats(sys.argv[3] if len(sys.argv) > 3 else "tottime").print_stats(40)
