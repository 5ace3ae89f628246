"""Upper bound of a stateful head's gain: the trimmed head with 15 context frames vs the head on new steps only."""
import torch, time
from fishserve.models.firefly import FireflyConfig, FireflyGenerator
from fishserve.models.firefly.triton_head import TritonHead
torch.manual_seed(0)
dev = torch.device("cuda")
dec = FireflyGenerator(FireflyConfig.released()).to(dev, torch.bfloat16).eval()
head = TritonHead(dec.head)
C = 512
def timed(fn, n=30):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn(); fn(); torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            fn()
        g.replay(); torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n): g.replay()
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3
# convs count for tail copies
convs = [head.pre] + [c for st in head.stages for c in ([st.up] + [x for pr in st.resblocks for p in pr for x in p])] + [head.post]
for B in (16, 32):
    for new in (10, 20, 40):
        ctx = 15
        x_ctx = torch.randn(B, (new + ctx) * 4, C, device=dev, dtype=torch.bfloat16)
        v_ctx = torch.full((B,), (new + ctx) * 4, device=dev, dtype=torch.int64)
        x_new = torch.randn(B, new * 4, C, device=dev, dtype=torch.bfloat16)
        v_new = torch.full((B,), new * 4, device=dev, dtype=torch.int64)
        out = new * 2048
        with torch.inference_mode():
            a = timed(lambda: head.decode_tail(x_ctx, v_ctx, out))
            b = timed(lambda: head.decode_tail(x_new, v_new, out))
            # tail save traffic stand-in: one small copy per conv (B x keep x C_in)
            bufs = []
            for c in convs:
                keep = max(1, (c.kernel_size - 1) * c.dilation)
                bufs.append((torch.zeros(B, keep, c.weight.shape[1], device=dev, dtype=torch.bfloat16),
                             torch.randn(B, keep, c.weight.shape[1], device=dev, dtype=torch.bfloat16)))
            def copies():
                for d, s in bufs: d.copy_(s)
            c_ms = timed(copies)
        print(f"B={B} new={new}: trimmed(ctx15) {a:.3f} ms  new-only {b:.3f} ms  gain {a/b:.3f}x  "
              f"{len(convs)} tail copies {c_ms:.3f} ms -> net {a/(b+c_ms):.3f}x", flush=True)
