import torch, triton
from fishserve.models.firefly.triton_head import PackedConv, causal_conv_cl
dev = torch.device("cuda"); torch.manual_seed(0)
B, FR = 16, 24
for c, spf in ((16, 2048), (32, 1024), (64, 512), (128, 256), (256, 32)):
    for k, d in ((11, 5), (11, 1), (3, 1)):
        w = torch.randn(k, c, c, device=dev, dtype=torch.bfloat16) * 0.1
        conv = PackedConv(w.contiguous(), torch.zeros(c, device=dev, dtype=torch.bfloat16), d)
        x = torch.randn(B, FR * spf, c, device=dev, dtype=torch.bfloat16)
        on = triton.testing.do_bench(lambda: causal_conv_cl(x, conv, silu_in=True), warmup=10, rep=50)
        off = triton.testing.do_bench(lambda: causal_conv_cl(x, conv, silu_in=False), warmup=10, rep=50)
        print(f"C={c:<3} K={k:<2} d={d}: silu_in {on*1e3:6.1f} us, no silu {off*1e3:6.1f} us ({on/off:.2f}x)", flush=True)
