"""Trimmed head (16-bit, released size, random weights) per call, CUDA-graph replay: B x new frames + 15 context."""
import sys, time, torch
import fishserve
from fishserve.models.firefly import FireflyConfig, FireflyGenerator
from fishserve.models.firefly.triton_head import TritonHead
torch.manual_seed(0)
dev = torch.device("cuda")
dec = FireflyGenerator(FireflyConfig.released()).to(dev, torch.bfloat16).eval()
head = TritonHead(dec.head)
def timed(fn, n=40):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn(); fn(); torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            out = fn()
        g.replay(); torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n): g.replay()
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3, out
res = {}
for B, new in ((1, 10), (16, 20), (32, 20), (16, 40), (16, 64)):
    x = torch.randn(B, (new + 15) * 4, 512, device=dev, dtype=torch.bfloat16)
    v = torch.full((B,), (new + 15) * 4, device=dev, dtype=torch.int64)
    with torch.inference_mode():
        ms, out = timed(lambda: head.decode_tail(x, v, new * 2048))
    res[(B, new)] = out.float().cpu()
    print(f"{sys.argv[1]} B={B:<3} new={new:<3} {ms:7.3f} ms/call  {B*new/ms*1e3:9,.0f} new frames/s", flush=True)
torch.save(res, f"/tmp/head_{sys.argv[1]}.pt")
if sys.argv[1] == "new":
    old = torch.load("/tmp/head_old.pt")
    for k, a in res.items():
        b = old[k]
        print(k, "max |new-old|", (a - b).abs().max().item(), "rel", ((a - b).norm() / b.norm()).item())
