"""Small-channel conv: config sweep + ncu target (one conv of the 16/32-channel stages)."""
import sys, torch, triton
import fishserve.models.firefly.triton_head as th
from fishserve.models.firefly.triton_head import PackedConv, causal_conv_cl
dev = torch.device("cuda"); torch.manual_seed(0)
B, FR = 16, 24
def make(c, k, d, steps_per_frame):
    w = torch.randn(k, c, c, device=dev, dtype=torch.bfloat16) * 0.1
    conv = PackedConv(w.contiguous(), torch.zeros(c, device=dev, dtype=torch.bfloat16), d)
    x = torch.randn(B, FR * steps_per_frame, c, device=dev, dtype=torch.bfloat16)
    return conv, x
def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=50)
orig_blocks, orig_stages = th._blocks, th.NUM_STAGES
if sys.argv[1:] == ["ncu"]:
    conv, x = make(16, 11, 5, 2048)
    for _ in range(3): causal_conv_cl(x, conv, silu_in=True)
    torch.cuda.synchronize(); sys.exit()
for c, spf in ((16, 2048), (32, 1024), (64, 512)):
    for k, d in ((11, 5), (3, 1)):
        conv, x = make(c, k, d, spf)
        ref = causal_conv_cl(x, conv, silu_in=True)
        base = bench(lambda: causal_conv_cl(x, conv, silu_in=True))
        y = torch.empty_like(x)
        cp = bench(lambda: y.copy_(x))
        gbs = 2 * x.numel() * 2 / base / 1e6
        print(f"C={c} K={k} d={d} T={x.shape[1]}: default {orig_blocks(c, c, 2)} st{orig_stages}: {base*1e3:.1f} us ({gbs:.0f} GB/s; copy {cp*1e3:.1f} us)", flush=True)
        best = (base, "default")
        for bt in (128, 256, 512):
            for warps in (4, 8):
                for st in (2, 3):
                    th._blocks = lambda ci, co, e, bt=bt, warps=warps: (bt, max(16, co), max(16, min(64, ci)), warps)
                    th.NUM_STAGES = st
                    try:
                        out = causal_conv_cl(x, conv, silu_in=True)
                        err = (out.float() - ref.float()).abs().max().item()
                        t = bench(lambda: causal_conv_cl(x, conv, silu_in=True))
                    except Exception as e:  # noqa
                        print("  fail", bt, warps, st, type(e).__name__); continue
                    if t < best[0]: best = (t, f"T{bt} w{warps} st{st} err{err:.1e}")
        th._blocks, th.NUM_STAGES = orig_blocks, orig_stages
        print(f"   best {best[0]*1e3:.1f} us {best[1]}", flush=True)
