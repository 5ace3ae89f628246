"""Per-layer times of the trimmed Triton head, and a block-config sweep per (C_in, C_out)."""

import collections
import itertools
import json
import os
import time

import torch
import triton
from triton.testing import do_bench

from fishserve.models.firefly import load_firefly
from fishserve.models.firefly import triton_head as th

OUT = os.environ.get("OUT", "/tmp")
log = open(f"{OUT}/convprof.txt", "a")


def p(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    log.write(s + "\n")
    log.flush()


dev = torch.device("cuda")
dec = load_firefly(None, None, device=dev, dtype=torch.bfloat16, load_format="dummy")
head = th.TritonHead(dec.head)
default_blocks = th._blocks
CFG = {}


def blocks(c_in, c_out, e):
    return CFG.get((c_in, c_out)) or default_blocks(c_in, c_out, e)


th._blocks = blocks


def make(B, new, ctx=15):
    T = (ctx + new) * 4
    x = (torch.randn(B, T, 512, device=dev) * 0.3).to(torch.bfloat16)
    valid = torch.full((B,), T, dtype=torch.int64, device=dev)
    return x, valid, new * 2048


def record(x, valid, n):
    calls, orig = [], th.causal_conv_cl

    def rec(xx, conv, **kw):
        calls.append((xx, conv, kw))
        return orig(xx, conv, **kw)

    th.causal_conv_cl = rec
    head.decode_tail(x, valid, n)
    th.causal_conv_cl = orig
    return calls


def bench(fn):
    return do_bench(fn, warmup=3, rep=15)


def whole(shapes):
    res = {}
    for B, new in shapes:
        x, valid, n = make(B, new)
        g = torch.cuda.CUDAGraph()
        head.decode_tail(x, valid, n)
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            head.decode_tail(x, valid, n)
        ms = bench(lambda: g.replay())
        res[f"B{B}_n{new}"] = (ms, B * new / ms * 1e3)
    return res


shapes = [(16, 24), (16, 40), (8, 16), (32, 24)]
base = whole(shapes)
p("graph replay, default configs:", {k: f"{v[0]:.2f} ms {v[1]:.0f} f/s" for k, v in base.items()})

x, valid, n = make(16, 24)
calls = record(x, valid, n)
rows = []
for xx, conv, kw in calls:
    ms = bench(lambda: th.causal_conv_cl(xx, conv, **kw))
    c_in, c_out = conv.weight.shape[1], conv.weight.shape[2]
    rows.append(
        (
            ms,
            c_in,
            c_out,
            conv.kernel_size,
            conv.dilation,
            conv.upsample,
            xx.shape[1],
            kw.get("out_len") or xx.shape[1],
            2 * xx.shape[0] * (kw.get("out_len") or xx.shape[1]) * c_in * c_out * conv.kernel_size,
        )
    )
tot = sum(r[0] for r in rows)
p(f"{len(rows)} convs, sum {tot:.2f} ms (B16 new24, eager per-call do_bench)")
by = collections.defaultdict(lambda: [0.0, 0, 0.0])
for r in rows:
    k = (r[1], r[2])
    by[k][0] += r[0]
    by[k][1] += 1
    by[k][2] += r[8]
for k, (ms, cnt, fl) in sorted(by.items(), key=lambda kv: -kv[1][0]):
    p(
        f"  cin {k[0]:4d} cout {k[1]:5d}: {cnt:3d} convs {ms:6.3f} ms ({ms / tot:.0%}) {fl / ms / 1e9:6.1f} TFLOP/s blocks {default_blocks(k[0], k[1], 2)}"
    )

# sweep per (c_in, c_out), on the class's heaviest conv
deadline = time.time() + float(os.environ.get("SWEEP_S", "240"))
best = {}
for k, _ in sorted(by.items(), key=lambda kv: -kv[1][0]):
    members = [(r, c) for r, c in zip(rows, calls) if (r[1], r[2]) == k]
    r0, (xx, conv, kw) = max(members, key=lambda m: m[0][0])
    c_in, c_out = k
    red = conv.kernel_size * c_in
    bns = [b for b in (16, 32, 64, 128, 256) if b <= max(16, triton.next_power_of_2(c_out))]
    bks = [b for b in (16, 32, 64, 128) if b <= max(16, triton.next_power_of_2(red))]
    results = []
    for bt, bn, bk, w in itertools.product((64, 128, 256), bns, bks, (4, 8)):
        if time.time() > deadline:
            break
        if 3 * (bt + bn) * bk * 2 > 200 * 1024 or bt * bn > 256 * 128 or bt * bn < 64 * 32:
            continue
        CFG[k] = (bt, bn, bk, w)
        try:
            ms = bench(lambda: th.causal_conv_cl(xx, conv, **kw))
        except Exception:
            continue
        results.append((ms, (bt, bn, bk, w)))
    CFG.pop(k, None)
    if not results:
        break
    results.sort()
    best[k] = results[0][1]
    p(
        f"  sweep cin {c_in} cout {c_out} K{conv.kernel_size} d{conv.dilation}: default {r0[0]:.4f} ms -> best {results[0][0]:.4f} {results[0][1]} ; top5 {[(round(a, 4), b) for a, b in results[:5]]}"
    )

CFG.update(best)
tuned = whole(shapes)
p(
    "graph replay, tuned configs:",
    {kk: f"{v[0]:.2f} ms {v[1]:.0f} f/s ({base[kk][0] / v[0]:.2f}x)" for kk, v in tuned.items()},
)
json.dump(
    {"best": {f"{a},{b}": v for (a, b), v in best.items()}, "base": base, "tuned": tuned},
    open(f"{OUT}/convprof.json", "w"),
)
