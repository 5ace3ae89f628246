import sys, time, collections
sys.path.insert(0, "tests")
import torch
from conftest import load_tiny_model, TINY_T2S
from fishserve.models.tokenizer import FishTokenizer
from fishserve.engine.engine import EngineConfig, LLMEngine, GenerationRequest
import fishserve.engine.runner as rn
import fishserve.engine.engine as en
import fishserve.engine.scheduler as sc
from fishserve.engine.decode_step import TokenStep
B = int(sys.argv[1]) if len(sys.argv) > 1 else 512
model = load_tiny_model(); tok = FishTokenizer(TINY_T2S)
eng = LLMEngine(model, tok, EngineConfig(kv_cache_dtype="fp32", num_kv_blocks=B*12+8, max_num_seqs=B, static_decode=True, max_num_batched_tokens=8192))
nc = model.config.num_codebooks
def fake_token(model, cache, inputs, use_triton, k):
    b = inputs.columns.shape[0]
    return TokenStep(torch.zeros(b, model.config.dim), torch.full((b,), 400), torch.ones(b, dtype=torch.bool))
FR = torch.randint(0, 1000, (B, 1 + nc)); FR[:, 0] = 400
def fake_codes(model, step, inputs, compiled=False):
    return FR[: step.token.shape[0]]
for i in range(B):
    eng.add_request(GenerationRequest(text="hello world", max_new_tokens=400, ignore_eos=True))
for _ in range(3): eng.step()
rn.decode_step_token, rn.decode_step_codes = fake_token, fake_codes
T = collections.Counter()
def timed(obj, name, key):
    f = getattr(obj, name)
    def w(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); T[key] += time.perf_counter() - t; return r
    setattr(obj, name, w)
timed(eng.scheduler, "schedule", "schedule")
timed(rn, "build_row_inputs", "build_row_inputs")
timed(rn, "carry_plan", "carry_plan")
timed(eng.runner, "_finish", "runner._finish(download+zip)")
# the frames' bookkeeping: per frame before the persistent batch (430ad2b), per step after it
timed(eng, "_on_frames" if hasattr(eng, "_on_frames") else "_on_frame", "on_frames")
timed(eng.runner, "_finish_rows", "finish_rows")
for _ in range(3): eng.step()
T.clear()
N = 40
t = time.perf_counter()
for _ in range(N): eng.step()
tot = (time.perf_counter() - t) / N * 1e3
print(f"B={B} total {tot:.2f} ms/step")
for k, v in T.items(): print(f"  {k:32s} {v/N*1e3:.3f} ms")
