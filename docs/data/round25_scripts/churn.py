"""Engine alone under churn (server-like): N requests in flight, each 216 frames of a short
text, a new one added as each finishes; async + boost 64. Prints steps/s, frames/s, boost
share and host CPU ms per step (process_time). Usage: churn.py TAG N SECONDS"""
import sys, time
import torch
from fishserve.engine.engine import EngineConfig, GenerationRequest, LLMEngine
from fishserve.engine.sampling import SamplingParams
from fishserve.models.loading import load_text2semantic
tag, N, DUR = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
model, tok = load_text2semantic(None, device=dev, dtype=dt, load_format="dummy", dummy_logits="peaked")
cfg = EngineConfig(max_num_seqs=1024, max_num_batched_tokens=4096, num_kv_blocks=1024 * 24,
                   decoder_workspace_bytes=0, async_scheduling=True, boost_frames=64)
eng = LLMEngine(model, tok, cfg)
TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away into the woods."
k = 0
def top_up():
    global k
    while len(eng.sequences) < N:
        eng.add_request(GenerationRequest(TEXT, [], SamplingParams(0.7, 0.7, 1.2, seed=k), chunk_length=0,
                                          max_new_tokens=216, ignore_eos=True, request_id=f"r{k}"))
        k += 1
# staggered start: add 8 per step, as the bench's ramp
t_end = time.perf_counter() + 6
while time.perf_counter() < t_end:
    for _ in range(8):
        if len(eng.sequences) < N:
            eng.add_request(GenerationRequest(TEXT, [], SamplingParams(0.7, 0.7, 1.2, seed=k), chunk_length=0,
                                              max_new_tokens=216, ignore_eos=True, request_id=f"r{k}"))
            k += 1
    eng.step()
s0, f0, b0, t0, c0 = eng.steps, eng.frames_generated, eng.boost_steps, time.perf_counter(), time.process_time()
while time.perf_counter() - t0 < DUR:
    top_up(); eng.step()
s, f, b = eng.steps - s0, eng.frames_generated - f0, eng.boost_steps - b0
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
print(f"{tag} N={N}: {s / wall:.1f} steps/s {f / wall:,.0f} frames/s boost={b / max(s, 1):.2f} "
      f"frames/step={f / max(s, 1):.0f} host_cpu={cpu / s * 1e3:.2f} ms/step", flush=True)
