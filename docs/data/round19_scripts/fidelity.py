"""Released-size decoder, random weights: rel. error vs the float32 PyTorch decoder (as test_triton_head_full_size_half_precision)."""
import sys, torch
from fishserve.models.firefly import build_dummy_firefly
from fishserve.models.firefly.triton_head import TritonHead
torch.backends.cudnn.allow_tf32 = False
torch.manual_seed(0)
codes = torch.randint(0, 1000, (3, 8, 40), device="cuda")
lengths = torch.tensor([40, 31, 7], device="cuda")
with torch.inference_mode():
    ref = build_dummy_firefly(device="cuda").decode_unchecked(codes, lengths)
    for dtype in (torch.bfloat16, torch.float16):
        half = build_dummy_firefly(device="cuda", dtype=dtype)
        th = half.decode_unchecked(codes, lengths)
        fu = half.decode_unchecked(codes, lengths, head=TritonHead(half.head))
        rel = lambda x: ((x.float() - ref).norm() / ref.norm()).item()
        print(sys.argv[1], dtype, f"torch {rel(th):.5f} triton {rel(fu):.5f} tail0 {fu[2,0,7*half.config.frame_samples:].abs().max().item()}", flush=True)
