import sys, time
sys.path.insert(0, "tests")
import torch
from conftest import load_tiny_model, TINY_T2S
from fishserve.models.tokenizer import FishTokenizer
from fishserve.engine.engine import EngineConfig, LLMEngine, GenerationRequest
import fishserve.engine.runner as rn
from fishserve.engine.decode_step import TokenStep
B = int(sys.argv[1]); ASYNC = sys.argv[2] == "async"; BOOST = int(sys.argv[3])
model = load_tiny_model(); tok = FishTokenizer(TINY_T2S)
eng = LLMEngine(model, tok, EngineConfig(kv_cache_dtype="fp32", num_kv_blocks=B*40+8, max_num_seqs=B+64, static_decode=True, max_num_batched_tokens=8192, async_scheduling=ASYNC, boost_frames=BOOST))
nc = model.config.num_codebooks
def fake_token(model, cache, inputs, use_triton, k):
    b = inputs.columns.shape[0]
    return TokenStep(torch.zeros(b, model.config.dim), torch.full((b,), 400), torch.ones(b, dtype=torch.bool))
FR = torch.randint(0, 1000, (4096, 1 + nc)); FR[:, 0] = 400
def fake_codes(model, step, inputs, compiled=False):
    return FR[: step.token.shape[0]]
rn.decode_step_token, rn.decode_step_codes = fake_token, fake_codes
for i in range(B):
    eng.add_request(GenerationRequest(text="hello world", max_new_tokens=300, ignore_eos=True))
for _ in range(80): eng.step()
t = time.perf_counter(); N = 0; k = 0
while N < 150:
    if N % 5 == 0:
        eng.add_request(GenerationRequest(text="hello world", max_new_tokens=300, ignore_eos=True))
    eng.step(); N += 1
dt = (time.perf_counter() - t) / N * 1e3
print(f"B={B} {sys.argv[2]} boost={BOOST}: {dt:.2f} ms/step running={len(eng.scheduler.running)}")
