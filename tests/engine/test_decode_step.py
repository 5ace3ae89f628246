"""The static-shape decode path (CUDA-graph safe) and the fused Triton attention kernel."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from conftest import load_tiny_model, make_engine, run_engine
from test_engine import sampled_requests

from fishserve.engine.graph_decoder import graph_buckets
from fishserve.engine.runner import is_decode_item

HAS_TRITON = importlib.util.find_spec("triton") is not None
CUDA = torch.cuda.is_available()


def test_static_decode_path_equals_the_general_path(tiny_model, tiny_tokenizer):
    general = run_engine(make_engine(tiny_model, tiny_tokenizer), sampled_requests())
    engine = make_engine(tiny_model, tiny_tokenizer, static_decode=True)
    static = run_engine(engine, sampled_requests())
    for rid, (codes, _) in general.items():
        assert torch.equal(static[rid][0], codes), rid


def run_staggered(engine, requests) -> tuple[dict[str, torch.Tensor], list[set[str]]]:
    """One new request per step (its prompt joins a decoding batch). Returns codes per request
    and, per step, the paths its positions took: "decode" / "prompt" rows of the static step,
    "general" for prefill chunks on the general path."""
    runner, paths = engine.runner, set()
    static, general_path = runner._launch_rows, runner._prefill

    def launch_rows(items):
        paths.update("decode" if is_decode_item(seq, n) else "prompt" for seq, n in items)
        return static(items)

    runner._launch_rows = launch_rows
    runner._prefill = lambda b: paths.add("general") or general_path(b)
    frames: dict[str, list[np.ndarray]] = {r.request_id: [] for r in requests}
    pending, steps = list(requests), []
    while pending or engine.has_work():
        if pending:
            engine.add_request(pending.pop(0))
        paths.clear()
        for event in engine.step():
            if event.codes is not None:
                frames[event.request_id].append(event.codes)
        steps.append(set(paths))
    return {rid: torch.from_numpy(np.stack(f, 1)) for rid, f in frames.items()}, steps


def test_prompts_join_the_static_decode_step(tiny_model, tiny_tokenizer):
    """Requests arriving while others decode: the new prompts' positions run as extra rows of
    the static step (no general path at all); codes equal an all-at-once general run."""
    requests = sampled_requests(4)
    general = run_engine(make_engine(tiny_model, tiny_tokenizer), requests)
    engine = make_engine(tiny_model, tiny_tokenizer, static_decode=True)
    staggered, steps = run_staggered(engine, requests)
    assert sum(paths == {"decode", "prompt"} for paths in steps) >= 2
    assert not any("general" in paths for paths in steps)
    for rid, (codes, _) in general.items():
        assert torch.equal(staggered[rid], codes), rid


def test_prompts_too_long_for_the_static_step_take_the_general_path(tiny_model, tiny_tokenizer):
    """With no room for prompt rows, mixed steps run decode rows on the static path and only
    the prefill chunks on the general one; codes still equal the general run."""
    requests = sampled_requests(4)
    general = run_engine(make_engine(tiny_model, tiny_tokenizer), requests)
    engine = make_engine(tiny_model, tiny_tokenizer, static_decode=True, static_prefill_tokens=0)
    staggered, steps = run_staggered(engine, requests)
    assert sum(paths == {"decode", "general"} for paths in steps) >= 2
    for rid, (codes, _) in general.items():
        assert torch.equal(staggered[rid], codes), rid


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("static_prefill_tokens", [256, 0])
def test_gpu_mixed_steps_with_graphs_equal_cpu(tiny_tokenizer, static_prefill_tokens):
    """On CUDA graphs, steps mixing decode rows and new prompts (as rows of the captured step,
    or eagerly with the frame head graph) give codes that agree with the CPU general path."""
    torch.backends.cuda.matmul.allow_tf32 = False
    requests = sampled_requests(4)
    general = run_engine(make_engine(load_tiny_model(), tiny_tokenizer), requests)
    model = load_tiny_model().cuda()
    engine = make_engine(model, tiny_tokenizer, static_prefill_tokens=static_prefill_tokens)
    assert engine.runner.graphs is not None
    staggered, steps = run_staggered(engine, requests)
    mixed = {"decode", "prompt"} if static_prefill_tokens else {"decode", "general"}
    assert sum(paths == mixed for paths in steps) >= 2
    agree = [torch.equal(staggered[rid], codes) for rid, (codes, _) in general.items()]
    assert sum(agree) >= 3, agree  # fp32 GPU kernels round differently; near-ties may flip


def test_graph_buckets():
    assert graph_buckets(1) == [1]
    assert graph_buckets(64) == [1, 2, 4, 8, 16, 32, 64]
    assert graph_buckets(48) == [1, 2, 4, 8, 16, 32, 48]


KERNEL_CHECK = textwrap.dedent("""
    import torch
    from fishserve.engine.kv_cache import KVCacheLayout, PagedKVCache
    from fishserve.engine.decode_attention import DecodeAttention, DecodeMetadata
    device = "{device}"
    torch.manual_seed(0)
    worst = {{}}
    for kv_dtype, q_dtype in {cases}:
        H, KV, D, bs, nb = 16, 2, 64, 16, 48
        cache = PagedKVCache(KVCacheLayout(1, KV, D, bs, nb, kv_dtype), device)
        lens = torch.tensor([1, 17, 100, 300], dtype=torch.int32, device=device)
        tables = torch.zeros(4, 20, dtype=torch.int32, device=device)
        perm = (torch.randperm(nb - 1) + 1).to(device)
        used = 0
        for i, n in enumerate(lens.tolist()):
            k = -(-n // bs)
            tables[i, :k] = perm[used:used + k]
            used += k
            pos = torch.arange(n - 1, device=device)
            slots = tables[i].long()[pos // bs] * bs + pos % bs
            cache.write(0, slots, torch.randn(n - 1, KV, D, device=device),
                        torch.randn(n - 1, KV, D, device=device))
        pos = lens.long() - 1
        slot = tables.long()[torch.arange(4, device=device), pos // bs] * bs + pos % bs
        q, k, v = (torch.randn(4, 1, h, D, device=device).to(q_dtype) for h in (H, KV, KV))
        meta = DecodeMetadata(slot, tables, lens)
        ref = DecodeAttention(cache, meta, False).forward(0, q.float(), k.float(), v.float())
        out = DecodeAttention(cache, meta, True).forward(0, q, k, v)
        rel = ((out.float() - ref).norm() / ref.norm()).item()
        worst[kv_dtype + "/" + str(q_dtype)] = rel
    print(worst)
    for name, rel in worst.items():
        limit = 1e-5 if name.endswith("float32") else 2e-2
        assert rel < limit, (name, rel)
""")


@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")
def test_triton_kernel_matches_torch_in_the_interpreter():
    """Runs the kernel through Triton's CPU interpreter (fp32 queries; the interpreter does
    not emulate bf16 dots)."""
    cases = [
        ("fp32", "torch.float32"),
        ("int8", "torch.float32"),
        ("fp8", "torch.float32"),
        ("fp16", "torch.float16"),
    ]
    script = KERNEL_CHECK.format(
        device="cpu", cases="[" + ", ".join(f"({k!r}, {q})" for k, q in cases) + "]"
    )
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.gpu
@pytest.mark.skipif(not (CUDA and HAS_TRITON), reason="needs CUDA and Triton")
def test_triton_kernel_matches_torch_on_gpu():
    cases = [
        (kv, q)
        for kv in ("bf16", "fp16", "int8", "fp8", "fp32")
        for q in ("torch.bfloat16", "torch.float32")
    ]
    script = KERNEL_CHECK.format(
        device="cuda", cases="[" + ", ".join(f"({k!r}, {q})" for k, q in cases) + "]"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    print(result.stdout)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("eager", [True, False])
def test_gpu_engine_equals_cpu_engine_in_fp32(tiny_model, tiny_tokenizer, eager):
    """fp32 weights and KV: CUDA graphs + Triton give the CPU path's codes (greedy cases)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cpu = run_engine(make_engine(tiny_model, tiny_tokenizer), sampled_requests(4))
    gpu_model = load_tiny_model().cuda()
    engine = make_engine(gpu_model, tiny_tokenizer, enforce_eager=eager)
    gpu = run_engine(engine, sampled_requests(4))
    agree = [torch.equal(gpu[rid][0], codes) for rid, (codes, _) in cpu.items()]
    assert sum(agree) >= 3, agree  # fp32 GPU kernels round differently; near-ties may flip
    assert engine.runner.num_captures == (0 if eager else len(graph_buckets(8 + 256)))


def test_profiling_dummy_step_runs_on_cpu(tiny_model):
    from fishserve.engine.profiling import dummy_step

    before = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    with torch.inference_mode():
        dummy_step(tiny_model, tokens=40, seqs=6, block_size=16, kv_dtype="int8")
    assert all(torch.equal(before[k], v) for k, v in tiny_model.state_dict().items())


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_gpu_activation_peak_is_measured(tiny_tokenizer):
    model = load_tiny_model().cuda()
    engine = make_engine(
        model, tiny_tokenizer, num_kv_blocks=None, memory_budget=2**30, enforce_eager=True
    )
    assert 0 < engine.memory.activations < 2**30
    assert engine.blocks.num_blocks == engine.memory.num_blocks
