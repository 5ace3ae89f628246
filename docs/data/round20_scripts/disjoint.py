"""Does confining the engine to its own SMs (disjoint from the decoder's) speed its steps?

Engine steps (batch B, context 200, peaked dummy logits) timed alone and beside a decoder
thread replaying 16 x 20-frame Triton calls back to back, in these arrangements:
  N   engine on ordinary streams (today)     + decoder on torch GreenContext(72) (today)
  G   engine on a green ctx of E SMs (groups 0..E/8-1) + decoder on the other groups (disjoint)
"""
import sys
import threading
import time

import torch
from cuda.bindings import driver as cu

from fishserve.audio.decoder_runner import DecoderRunner, ChunkPolicy  # noqa
from fishserve.bench import decoder_speed as ds
from fishserve.bench import engine_speed as es
from fishserve.engine.engine import EngineConfig, LLMEngine
from fishserve.models.firefly import load_firefly
from fishserve.models.loading import load_text2semantic

E_GROUPS = int(sys.argv[1]) if len(sys.argv) > 1 else 7  # engine SMs = 8 x this
BATCHES = [256, 512]
dev = torch.device("cuda")
torch.zeros(1, device=dev)


def ok(r):
    assert r[0] == cu.CUresult.CUDA_SUCCESS, r
    return r[1] if len(r) == 2 else r[1:]


cudev = ok(cu.cuDeviceGet(0))
res = ok(cu.cuDeviceGetDevResource(cudev, cu.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM))
groups, nb, rem = ok(cu.cuDevSmResourceSplitByCount(16, res, 0, 8))
print("split:", nb, "groups of", [g.sm.smCount for g in groups[:nb]], "remaining", rem.sm.smCount, flush=True)
lo, hi = -1, 0
try:
    lo, hi = torch.cuda.Stream.priority_range()
except Exception:
    pass
KEEP = []


def green_stream(gs, priority):
    desc = ok(cu.cuDevResourceGenerateDesc(gs, len(gs)))
    g = ok(cu.cuGreenCtxCreate(desc, cudev, cu.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM))
    s = ok(cu.cuGreenCtxStreamCreate(g, cu.CUstream_flags.CU_STREAM_NON_BLOCKING, priority))
    KEEP.append((desc, g, s))
    ptr = int(s) if hasattr(s, "__int__") else s.getPtr()
    return torch.cuda.ExternalStream(ptr, device=dev)


eng_stream = green_stream(list(groups[:E_GROUPS]), min(lo, hi))
dec_stream = green_stream(list(groups[E_GROUPS:nb]), 0)
print(f"engine SMs {8 * E_GROUPS}, decoder SMs {8 * (nb - E_GROUPS)}", flush=True)

_Stream = torch.cuda.Stream


class patched:
    def __init__(self, s):
        self.s = s

    def __enter__(self):
        torch.cuda.Stream = lambda *a, **k: self.s

    def __exit__(self, *a):
        torch.cuda.Stream = _Stream


model, tok = load_text2semantic(None, device=dev, dtype=torch.bfloat16, load_format="dummy",
                                dummy_logits="peaked")
block = 16
per_seq = -(-(200 + 400 + 64) // block)


def engine():
    cfg = EngineConfig(kv_cache_dtype="auto", block_size=block, max_num_seqs=max(BATCHES),
                       max_num_batched_tokens=8192, num_kv_blocks=per_seq * max(BATCHES),
                       decoder_workspace_bytes=0, top_k_prefilter=1024)
    return LLMEngine(model, tok, cfg)


t = time.time()
eng_n = engine()
print(f"engine N built {time.time() - t:.1f}s", flush=True)
t = time.time()
with patched(eng_stream), torch.cuda.stream(eng_stream):
    eng_g = engine()
print(f"engine G built {time.time() - t:.1f}s; runner stream is green: {eng_g.runner.stream is eng_stream}", flush=True)

dec = load_firefly(None, None, device=dev, dtype=torch.bfloat16, load_format="dummy")
t = time.time()
pol = ChunkPolicy(first_chunk_frames=20, chunk_frames=20)
dec_p = DecoderRunner.for_policy(dec, pol, 16, trim=True, kernels="triton", num_sms=72)
with patched(dec_stream):
    dec_d = DecoderRunner.for_policy(dec, pol, 16, trim=True, kernels="triton")
print(f"decoders built {time.time() - t:.1f}s; dec_d stream green: {dec_d.stream is dec_stream}", flush=True)
jobs = ds.make_jobs(dec, 16, [20])
text = es.prompt_text(tok, 200)


def dec_loop(runner, stop, out):
    n = 0
    t0 = time.perf_counter()
    while not stop.is_set():
        runner.decode_jobs(jobs)
        n += 1
    out.append(n * 16 * 20 / (time.perf_counter() - t0))


def point(eng, runner, batch):
    es.fill_decode(eng, batch, text, 300)
    stop, out = threading.Event(), []
    th = None
    if runner is not None:
        th = threading.Thread(target=dec_loop, args=(runner, stop, out))
        th.start()
        time.sleep(0.3)
    ms = es.time_steps(eng, 40) * 1e3
    stop.set()
    if th:
        th.join()
    for rid in list(eng.sequences):
        eng.abort(rid)
    return ms, (out[0] if out else 0)


for name, runner in (("P72", dec_p), ("D", dec_d)):
    stop, out = threading.Event(), []
    th = threading.Thread(target=dec_loop, args=(runner, stop, out))
    th.start(); time.sleep(2); stop.set(); th.join()
    print(f"decoder {name} alone: {out[0]:,.0f} new frames/s", flush=True)
for batch in BATCHES:
    for label, eng, runner in (("N alone", eng_n, None), ("G alone", eng_g, None),
                               ("N + P72 (today)", eng_n, dec_p), ("G + D (disjoint)", eng_g, dec_d),
                               ("G + P72 (overlapping)", eng_g, dec_p)):
        ms, fps = point(eng, runner, batch)
        print(f"B={batch:4d} {label:24s} engine {ms:6.2f} ms/step  decoder {fps:9,.0f} frames/s", flush=True)
